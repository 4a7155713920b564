-- A node's heartbeat: one field of the members hash, "<expires>|<beat>|<info json>", in Redis time.
-- Also the data's epoch: a token set once; if Redis restarts empty, the next beat sets a new one,
-- and every node sees that Redis lost its keys (claims, parked retries) and recovers what it can.
-- And how far the cluster has fired: the furthest progress any ready node reported, so that a node
-- coming back can tell an outage of the whole cluster from one of PostgreSQL alone.
-- KEYS[1]: the members hash. KEYS[2]: the epoch. KEYS[3]: the cluster's progress (ms).
-- ARGV[1]: node id. ARGV[2]: TTL (ms). ARGV[3]: info (JSON). ARGV[4]: a new epoch token, used if
-- there is none. ARGV[5]: this node's progress (ms), '' if it is not firing yet.
-- Returns the epoch token and the cluster's progress ('' if none).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[2])) .. '|' .. now .. '|' .. ARGV[3])
redis.call('SET', KEYS[2], ARGV[4], 'NX')
if ARGV[5] ~= '' then
  local mark = tonumber(redis.call('GET', KEYS[3]) or '0')
  if tonumber(ARGV[5]) > mark then
    redis.call('SET', KEYS[3], ARGV[5])
  end
end
return {redis.call('GET', KEYS[2]), redis.call('GET', KEYS[3]) or ''}
