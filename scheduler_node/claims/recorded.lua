-- Forget history rows the writer has put in PostgreSQL: take each kept row alone, or each batch
-- whose rows are all written (scheduler_node/claims/rows.py), out of its unrecorded set, and
-- delete a batch's value. One call for many (a ZREM per slot would be a command, and a reply, each).
-- KEYS, two per member: the unrecorded set it is in, and the batch's key (the set again for a row).
-- ARGV, one per member: a row, or a batch's member ("b|...").
-- Returns how many were removed.
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('ZREM', KEYS[2 * i - 1], ARGV[i])
  if string.sub(ARGV[i], 1, 2) == 'b|' then
    redis.call('DEL', KEYS[2 * i])
  end
end
return n
