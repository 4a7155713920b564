-- Renew claims this node holds on executions still in flight (or waiting to retry).
-- KEYS: claim keys. ARGV[1]: key TTL in ms. ARGV[2]: our claim prefix "c|<node>|".
-- ARGV[2+i]: the new claim value for KEYS[i] ("c|<node>|<attempt>|<deadline_ms>").
-- Returns per key: 1 renewed, 2 re-claimed (the key had vanished, e.g. Redis lost it), 0 lost.
local ttl, mine = ARGV[1], ARGV[2]
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v == false then
    redis.call('SET', key, ARGV[2 + i], 'PX', ttl)
    out[i] = 2
  elseif string.sub(v, 1, #mine) == mine then
    redis.call('SET', key, ARGV[2 + i], 'PX', ttl)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
