-- Renew claims this node holds, or park them until later (a retry waiting for its backoff, or
-- work handed over when the node stops): the claim's deadline moves to now + duration, and so
-- does its score in the slot's index of open claims, where any owner of the slot finds it.
-- KEYS, three per execution: claim key, the slot's index, overlap guard (the claim key if none).
-- ARGV[1]: holder. ARGV[2]: how long a finished mark is kept (ms). Then four per execution:
--   index member, attempt, duration (ms), flags: 1 it has a guard, 2 a park on to this attempt.
-- A renewal of an earlier attempt than the claim holds is stale (it was sent before the park of
-- the next attempt and arrived after it: a slow or retried call) and changes nothing: the claim
-- keeps the attempt and the time it was parked with. So is a park on to an attempt the claim
-- holds already: the same park made before (a call tried again after its answer was lost), and
-- the node may have taken the retry back since and be sending it; moving its deadline back would
-- let the slot's other owner take it and send it too.
-- Returns per execution: 1 renewed, 2 re-claimed (the claim had vanished), 0 lost to another node.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, keep = ARGV[1], tonumber(ARGV[2])
local mine = 'c|' .. holder .. '|'
local out = {}
for i = 1, #KEYS / 3 do
  local key, open, guard = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local base = 2 + 4 * (i - 1)
  local member, attempt, duration = ARGV[base + 1], tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local flags = tonumber(ARGV[base + 4])
  local guarded, advance = flags % 2 == 1, flags >= 2
  local v = redis.call('GET', key)
  local result = 0
  if v == false then
    result = 2
  elseif string.sub(v, 1, #mine) == mine then
    result = 1
  end
  local stale = false
  if result == 1 then
    local held = tonumber(string.match(string.sub(v, #mine + 1), '^(%d+)|') or '0')
    stale = held > attempt or (advance and held == attempt)
  end
  if result > 0 and not stale then
    local deadline = now + duration
    redis.call('SET', key, mine .. attempt .. '|' .. deadline, 'PX', keep + duration)
    redis.call('ZADD', open, deadline, member)
    if guarded then
      local g = redis.call('GET', guard)
      if g == false or string.sub(g, 1, #key + 1) == key .. '|' then
        redis.call('SET', guard, key .. '|' .. deadline, 'PX', keep + duration)
      end
    end
  end
  out[i] = result
end
return out
