-- What an owner of some slots should look at: open claims due now (lease run out, or parked
-- until now) and history rows delivered more than a given age ago (their writer should have
-- recorded them by then; if it died, the owner writes them).
-- KEYS, two per slot: its index of open claims, its unrecorded set.
-- ARGV[1]: at most this many of each per slot. ARGV[2]: the age (ms) of rows to return, -1 for none.
-- Returns, per slot, two lists: the due index members, the old rows.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, age = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS / 2 do
  table.insert(out, redis.call('ZRANGEBYSCORE', KEYS[2 * i - 1], '-inf', now, 'LIMIT', 0, limit))
  if age >= 0 then
    table.insert(out, redis.call('ZRANGEBYSCORE', KEYS[2 * i], '-inf', now - age, 'LIMIT', 0, limit))
  else
    table.insert(out, {})
  end
end
return out
