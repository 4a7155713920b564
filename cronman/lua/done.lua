-- Mark executions finished ("d|<node>|<status>|<attempt>") if this node still holds them, and
-- remember their history rows in this node's "unrecorded" set until the rows are in PostgreSQL,
-- so that a survivor can write them if this node dies first.
-- KEYS[1]: the node's unrecorded set; KEYS[2..n+1]: claim keys.
-- ARGV[1]: TTL in ms. ARGV[2]: our claim prefix "c|<node>|".
-- ARGV[2+i]: done value for KEYS[1+i]; ARGV[2+n+i]: its history row ('' for none).
-- Returns per claim key: 1 marked, 0 superseded (another node took the execution over: a duplicate).
local ttl, mine = ARGV[1], ARGV[2]
local n = #KEYS - 1
local out = {}
for i = 1, n do
  local key = KEYS[1 + i]
  local v = redis.call('GET', key)
  if v == false or string.sub(v, 1, #mine) == mine then
    redis.call('SET', key, ARGV[2 + i], 'PX', ttl)
    out[i] = 1
  else
    out[i] = 0
  end
  local row = ARGV[2 + n + i]
  if row ~= '' then
    redis.call('SADD', KEYS[1], row)
  end
end
return out
