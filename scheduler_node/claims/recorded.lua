-- Forget history rows the writer has put in PostgreSQL: take each out of its slot's unrecorded set.
-- One call for a whole batch of rows (a ZREM per slot would be a command, and a reply, per row).
-- KEYS, one per row: its slot's unrecorded set. ARGV, one per row: the row (the set's member).
-- Returns how many were removed.
local n = 0
for i = 1, #KEYS do
  n = n + redis.call('ZREM', KEYS[i], ARGV[i])
end
return n
