-- A node's heartbeat: one field of the members hash, "<expires>|<beat>|<info json>", in Redis time.
-- KEYS[1]: the members hash. ARGV[1]: node id. ARGV[2]: TTL (ms). ARGV[3]: info (JSON).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[2])) .. '|' .. now .. '|' .. ARGV[3])
return now
