-- Grant throttle permits, oldest waiter first, across the whole cluster. Times are Redis's own.
-- KEYS[1]: the policy's holders (a sorted set scored by lease expiry). KEYS[2]: the policy's
-- theoretical arrival time for its rate limit (GCRA): permits are spaced `interval` ms apart.
-- Both carry the policy's hash tag.
-- ARGV[1]: permit lease (ms). ARGV[2]: max in flight. ARGV[3]: interval (ms) between permits
-- (0: no rate limit). ARGV[4]: how far ahead of its slot a permit may be granted (ms, about one
-- timer pass). ARGV[5..]: waiting members, in order.
-- Returns how many of the waiting members, from the first, got a permit.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease, max_in_flight = tonumber(ARGV[1]), tonumber(ARGV[2])
local interval, ahead = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local count = redis.call('ZCARD', KEYS[1])
local tat = tonumber(redis.call('GET', KEYS[2]) or '0')
if tat < now then
  tat = now
end
local granted = 0
for i = 5, #ARGV do
  if count >= max_in_flight or (interval > 0 and tat > now + ahead) then
    break
  end
  redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
  count = count + 1
  tat = tat + interval
  granted = granted + 1
end
if interval > 0 and granted > 0 then
  redis.call('SET', KEYS[2], tat, 'PX', math.ceil(tat - now) + 1000)
end
redis.call('PEXPIRE', KEYS[1], lease * 4)
return granted
