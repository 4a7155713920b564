-- The live cluster: members whose heartbeat key still exists; forget the others.
-- KEYS[1]: the members set. ARGV[1]: heartbeat key prefix.
-- Returns a flat list: node id, heartbeat value, ...
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local v = redis.call('GET', ARGV[1] .. id)
  if v == false then
    redis.call('SREM', KEYS[1], id)
  else
    table.insert(out, id); table.insert(out, v)
  end
end
return out
