-- The live cluster: members whose heartbeat has not expired (in Redis time); forget the others.
-- KEYS[1]: the members hash.
-- Returns a flat list: now (ms), then node id, ms since its heartbeat, info (JSON), ...
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local id, v = all[i], all[i + 1]
  local expires, beat, info = string.match(v, '^(%d+)|(%d+)|(.*)$')
  if expires == nil or tonumber(expires) < now then
    redis.call('HDEL', KEYS[1], id)
  else
    table.insert(out, id); table.insert(out, now - tonumber(beat)); table.insert(out, info)
  end
end
return out
