-- What an owner of some slots should look at: open claims due now (lease run out, or parked
-- until now) and history rows delivered more than a given age ago (their writer should have
-- recorded them by then; if it died, the owner writes them).
-- KEYS, two per slot: its index of open claims, its unrecorded set.
-- ARGV[1]: at most this many of each per slot. ARGV[2]: the age (ms) of rows to return, -1 for none.
-- Returns three entries per slot that has anything to return, none for the others (almost every
-- slot, almost every time): the slot's position among the call's slots (1-based), its due index
-- members, its old rows. (Two empty lists for every slot made the reply most of the call's cost.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, age = tonumber(ARGV[1]), tonumber(ARGV[2])
local none = {}
local out = {}
for i = 1, #KEYS / 2 do
  local due = redis.call('ZRANGEBYSCORE', KEYS[2 * i - 1], '-inf', now, 'LIMIT', 0, limit)
  local old = none
  if age >= 0 then
    old = redis.call('ZRANGEBYSCORE', KEYS[2 * i], '-inf', now - age, 'LIMIT', 0, limit)
  end
  if #due > 0 or #old > 0 then
    out[#out + 1] = i
    out[#out + 1] = due
    out[#out + 1] = old
  end
end
return out
