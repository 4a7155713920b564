-- A dashboard login attempt, counted before the key is checked: the check and the count are one
-- step, so attempts sent at once cannot all pass a check that a single one would fail.
-- KEYS[1]: attempts at this key from this client; KEYS[2]: attempts from this client, any key
-- (both under the client's hash tag). ARGV[1], ARGV[2]: their limits; ARGV[3]: the window (s),
-- from the first attempt in it.
-- Returns 0 when the attempt may go on (it counts as failed until forgiven), else the seconds
-- until the window of a counter at its limit ends.
local window = tonumber(ARGV[3])
local wait = 0
for i = 1, 2 do
  local n = tonumber(redis.call('GET', KEYS[i]) or '0')
  if n >= tonumber(ARGV[i]) then
    local ttl = redis.call('TTL', KEYS[i])
    if ttl < 0 then
      redis.call('EXPIRE', KEYS[i], window)
      ttl = window
    end
    if ttl > wait then
      wait = ttl
    end
  end
end
if wait > 0 then
  return wait
end
for i = 1, 2 do
  if redis.call('INCR', KEYS[i]) == 1 then
    redis.call('EXPIRE', KEYS[i], window)
  end
end
return 0
