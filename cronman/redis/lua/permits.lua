-- Renew the leases of throttle permits still in use (deliveries in flight), in Redis time.
-- KEYS[1]: the policy's holders (see throttle.lua). ARGV[1]: permit lease (ms).
-- ARGV[2..]: the members to renew; a member no longer holding a permit is left out (XX).
-- Returns how many were renewed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 4)
return renewed
