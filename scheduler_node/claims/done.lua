-- Mark executions finished ("d|<holder>|<status>|<attempt>") if this node still holds them, take
-- them out of the slot's index of open claims, and keep their history rows (scored by Redis time)
-- until the writer says they are in PostgreSQL, so that an owner of the slot can write them if this
-- node dies first: a call's rows together as one batch (scheduler_node/claims/rows.py), or a row
-- alone as a member of its slot's unrecorded set.
-- KEYS, four per execution: claim key, the slot's index, overlap guard (the claim key if none),
--   the slot's unrecorded set; with a batch, two more at the end: the batch's key and the
--   unrecorded set it is listed in.
-- ARGV[1]: holder. ARGV[2]: how long a finished mark is kept (ms). ARGV[3]: the batch's member
--   ('' for none). ARGV[4]: the batch's value. Then four per execution: index member, finished
--   value, history row kept alone ('' for none), '1' if it has a guard.
-- Returns per execution: 1 marked, 0 superseded (another node had taken it over: a duplicate).
-- (A mark of this holder's own, e.g. the claim's "skipped", counts as held: it is replaced.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, keep, batch = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local mine = 'c|' .. holder .. '|'
local finished = 'd|' .. holder .. '|'  -- (built once per call, as are their lengths)
local nm, nf = #mine, #finished
local n = #KEYS
if batch ~= '' then
  n = n - 2
end
local out = {}
for i = 1, n / 4 do
  local key, open, guard, unrec = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local base = 4 + 4 * (i - 1)
  local member, value, row, guarded = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4] == '1'
  -- Marked at once, reading what was there (one call, where a GET before the SET was two): when
  -- it was another node's, it is put back as it was, a claim with the expiry it had (its deadline
  -- and the time a mark is kept), a finished mark kept from now.
  local v = redis.call('SET', key, value, 'PX', keep, 'GET')
  if v == false or string.sub(v, 1, nm) == mine or string.sub(v, 1, nf) == finished then
    redis.call('ZREM', open, member)
    if guarded then
      local g = redis.call('GET', guard)
      if g and string.sub(g, 1, #key + 1) == key .. '|' then
        redis.call('SET', guard, key .. '|0', 'PX', keep)
      end
    end
    out[i] = 1
  else
    local ttl = keep
    if string.sub(v, 1, 2) == 'c|' then
      ttl = math.max(1, tonumber(string.match(v, '|(%d+)$') or '0') + keep - now)
    end
    redis.call('SET', key, v, 'PX', ttl)
    out[i] = 0
  end
  if row ~= '' then
    redis.call('ZADD', unrec, now, row)
  end
end
if batch ~= '' then
  redis.call('SET', KEYS[n + 1], ARGV[4])
  redis.call('ZADD', KEYS[n + 2], now, batch)
end
return out
