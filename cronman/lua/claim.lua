-- Claim due executions: SET NX with a lease, one round trip for the whole batch.
-- For a job with overlap_policy "skip", KEYS[i]'s guard is the job's "running" key, which points
-- at the claim key of the job's latest execution that was not skipped. If that execution is still
-- held by a live claim, the won claim becomes a skip (marked done as skipped); otherwise the
-- running key is pointed at the new execution.
-- KEYS: claim keys. ARGV[1]: claim value. ARGV[2]: TTL ms. ARGV[3]: now (ms, caller's clock).
-- ARGV[4]: the done value for a skipped execution. ARGV[4+i]: guard key for KEYS[i] ('' for none).
-- Returns per key: 1 won, 0 lost, 2 won but skipped (the previous execution is still in flight).
local value, ttl, now, skipped = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, value, 'NX', 'PX', ttl) then
    out[i] = 1
    local guard = ARGV[4 + i]
    if guard ~= '' then
      local busy = false
      local previous = redis.call('GET', guard)
      if previous and previous ~= key then
        local v = redis.call('GET', previous)
        if v and string.sub(v, 1, 2) == 'c|' then
          local held_until = tonumber(string.match(v, '|(%d+)$')) or 0
          busy = held_until >= now
        end
      end
      if busy then
        redis.call('SET', key, skipped, 'PX', ttl)
        out[i] = 2
      else
        redis.call('SET', guard, key, 'PX', ttl)
      end
    end
  else
    out[i] = 0
  end
end
return out
