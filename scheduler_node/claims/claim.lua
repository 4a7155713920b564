-- Claim due executions (their first attempt): SET NX with a lease, for a whole batch at once.
-- Times are Redis's own (TIME), never the callers' clocks.
-- KEYS, three per execution: its claim key, its slot's index of open claims, its overlap guard
--   (the claim key again when the job has none).
-- ARGV[1]: holder ("<node>/<incarnation>"). ARGV[2]: lease (ms). ARGV[3]: how long a finished
--   mark is kept (ms). Then two per execution: its index member, and flags: 1 if it has a guard,
--   plus 2 if this holder asked for it before without getting an answer.
-- A guard holds "<claim key>|<deadline>" of the job event's latest execution that was not
-- skipped; while that deadline lies ahead (in flight, or parked waiting to retry), a new
-- execution is skipped: held (as if won, without the guard) until its holder marks it finished
-- with its "skipped" history row.
-- A first-attempt claim of this holder's found again (asked before, its answer lost) is won again,
-- its lease extended to now + lease if it ends sooner. Asked for the first time, a claim that is
-- there already is lost without reading it (the other owner's, almost always: a read per
-- occurrence saved).
-- Returns per execution: 0 lost, 1 won, 2 won but skipped.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, lease, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local mine = 'c|' .. holder .. '|'
local deadline = now + lease
-- the same for every execution of the call: built once (a Lua string is hashed when it is made)
local first = mine .. '1|'
local value, ttl, n = first .. deadline, keep + lease, #mine + 2
local out = {}
for i = 1, #KEYS / 3 do
  local key, open, guard = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local member, flags = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i])
  local guarded, again = flags % 2 == 1, flags >= 2
  if redis.call('SET', key, value, 'NX', 'PX', ttl) then
    local busy = false
    if guarded then
      local g = redis.call('GET', guard)
      if g then
        local other, until_ms = string.match(g, '^(.*)|(%d+)$')
        busy = other ~= key and tonumber(until_ms or '0') >= now
      end
    end
    if busy then
      -- held like a won claim until the holder's done mark brings the skip's history row: a
      -- holder that dies first leaves it to a taker (delivered late rather than lost)
      redis.call('ZADD', open, deadline, member)
      out[i] = 2
    else
      redis.call('ZADD', open, deadline, member)
      if guarded then
        redis.call('SET', guard, key .. '|' .. deadline, 'PX', ttl)
      end
      out[i] = 1
    end
  elseif again then
    local v = redis.call('GET', key)
    -- Our own first-attempt claim, made by a call whose answer we never got: still ours, and held
    -- from now (a repeat may come after its lease ran out: a batch that failed on another shard).
    -- A retry of ours parked there is not: it is taken when its time comes.
    if v and string.sub(v, 1, n) == first then
      if tonumber(string.match(v, '|(%d+)$') or '0') < deadline then
        redis.call('SET', key, value, 'PX', ttl)
        redis.call('ZADD', open, deadline, member)
        if guarded then
          local g = redis.call('GET', guard)
          if g == false or string.sub(g, 1, #key + 1) == key .. '|' then
            redis.call('SET', guard, key .. '|' .. deadline, 'PX', ttl)
          end
        end
      end
      out[i] = 1
    else
      out[i] = 0
    end
  else
    out[i] = 0
  end
end
return out
