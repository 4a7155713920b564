-- A dashboard login succeeded: it no longer counts against its counters (login_attempt.lua).
-- KEYS: the counters the attempt was counted in.
for i = 1, #KEYS do
  local n = tonumber(redis.call('GET', KEYS[i]) or '0')
  if n > 1 then
    redis.call('DECR', KEYS[i])
  elseif n == 1 then
    redis.call('DEL', KEYS[i])
  end
end
return 0
