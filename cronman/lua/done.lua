-- Mark executions finished ("d|<node>|<status>|<attempt>") if this node still holds them.
-- KEYS: claim keys. ARGV[1]: TTL in ms. ARGV[2]: our claim prefix "c|<node>|". ARGV[2+i]: done value.
-- Returns per key: 1 marked, 0 superseded (another node took the execution over: a duplicate).
local ttl, mine = ARGV[1], ARGV[2]
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v == false or string.sub(v, 1, #mine) == mine then
    redis.call('SET', key, ARGV[2 + i], 'PX', ttl)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
