-- A replica that lost the claim checks back on executions after the lease.
-- KEYS: claim keys. ARGV[1]: TTL in ms. ARGV[2]: now (ms, the caller's clock).
-- ARGV[3]: our claim prefix "c|<node>|". ARGV[4]: our new deadline (ms).
-- Returns a flat list, two numbers per key:
--   0, 0          done (or held by us already)
--  -1, deadline   still held by a live claim: check again after the deadline
--   1, attempt    the holder's deadline passed: taken over by us, resume at that attempt
--   2, 1          no record at all (Redis lost it): taken over by us; verify history before firing
local ttl, now, mine, deadline = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local out = {}
for _, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v == false then
    redis.call('SET', key, mine .. '1|' .. deadline, 'PX', ttl)
    table.insert(out, 2); table.insert(out, 1)
  elseif string.sub(v, 1, 2) == 'd|' or string.sub(v, 1, #mine) == mine then
    table.insert(out, 0); table.insert(out, 0)
  else
    -- "c|<node>|<attempt>|<deadline>"
    local attempt, held_until = string.match(v, '^c|[^|]*|(%d+)|(%d+)$')
    held_until = tonumber(held_until) or 0
    if held_until < now then
      attempt = tonumber(attempt) or 1
      redis.call('SET', key, mine .. attempt .. '|' .. deadline, 'PX', ttl)
      table.insert(out, 1); table.insert(out, attempt)
    else
      table.insert(out, -1); table.insert(out, held_until)
    end
  end
end
return out
