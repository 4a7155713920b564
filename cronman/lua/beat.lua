-- A node's heartbeat: one field of the members hash, "<expires>|<beat>|<info json>", in Redis time.
-- Also the data's epoch: a token set once; if Redis restarts empty, the next beat sets a new one,
-- and every node sees that Redis lost its keys (claims, parked retries) and recovers what it can.
-- KEYS[1]: the members hash. KEYS[2]: the epoch. ARGV[1]: node id. ARGV[2]: TTL (ms).
-- ARGV[3]: info (JSON). ARGV[4]: a new epoch token, used if there is none.
-- Returns the epoch token.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[2])) .. '|' .. now .. '|' .. ARGV[3])
redis.call('SET', KEYS[2], ARGV[4], 'NX')
return redis.call('GET', KEYS[2])
