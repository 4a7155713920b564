-- Take over open executions of a slot this node owns whose lease ran out, or whose parking time
-- came (a retry due now, work another node handed over).
-- KEYS, three per execution: claim key, the slot's index, overlap guard (the claim key if none).
-- ARGV[1]: holder. ARGV[2]: lease (ms). ARGV[3]: how long a finished mark is kept (ms).
--   Then two per execution: index member, flags: 1 if it has a guard, plus 2 if this holder took
--   it over before without getting an answer (its lease, if live, is ours: taken again).
-- Returns two numbers per execution (see scheduler_node.parts.TakeState):
--   0, 0        gone: no longer in the index
--   1, until    held by a live claim (or parked) until then
--   2, attempt  taken over: ours now, resume at that attempt
--   3, 1        the index knew it but the claim was lost (Redis lost keys): ours; check history
--   4, 0        finished (the index entry is removed)
--   5, 0        unknown: neither the index nor the claim (Redis lost both)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder, lease, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local mine = 'c|' .. holder .. '|'
local deadline = now + lease
local out = {}
for i = 1, #KEYS / 3 do
  local key, open, guard = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local member, flags = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i])
  local guarded, again = flags % 2 == 1, flags >= 2
  local state, value = 0, 0
  if not redis.call('ZSCORE', open, member) then
    local v = redis.call('GET', key)
    if v == false then
      state = 5
    elseif string.sub(v, 1, 2) == 'd|' then
      state = 4
    else
      state, value = 1, tonumber(string.match(v, '|(%d+)$')) or 0
    end
  else
    local v = redis.call('GET', key)
    local attempt = nil
    if v == false then
      state, value, attempt = 3, 1, 1
    elseif string.sub(v, 1, 2) == 'd|' then
      redis.call('ZREM', open, member)
      state = 4
    else
      local a, held_until = string.match(v, '^c|[^|]*|(%d+)|(%d+)$')
      held_until = tonumber(held_until) or 0
      if held_until > now and not (again and string.sub(v, 1, #mine) == mine) then
        redis.call('ZADD', open, held_until, member)
        state, value = 1, held_until
      else
        attempt = tonumber(a) or 1
        state, value = 2, attempt
      end
    end
    if attempt then
      redis.call('SET', key, mine .. attempt .. '|' .. deadline, 'PX', keep + lease)
      redis.call('ZADD', open, deadline, member)
      if guarded then
        redis.call('SET', guard, key .. '|' .. deadline, 'PX', keep + lease)
      end
    end
  end
  table.insert(out, state)
  table.insert(out, value)
end
return out
