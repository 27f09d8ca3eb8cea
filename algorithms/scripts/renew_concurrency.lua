-- Concurrency renew: extends a held slot to expire `period` ms from now
-- (never earlier than it already would). A slot that is unknown, released
-- or expired is not brought back. The rules, shared with the Go model
-- (ConcurrencyState.Renew), are docs/algorithms.md, "Concurrency".
--
-- KEYS[1]  base:cc  ZSET, one member per slot: its id, scored by its expiry
-- ARGV     limit, period_ms, cost (ignored), now_ms ("" = Redis TIME), id
-- Reply    {held (0|1), limit, remaining, reset_after_ms}

local slots = KEYS[1]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local now = now_ms(ARGV[4])
local id = ARGV[5]
local live = '(' .. int(now)

local old = tonumber(redis.call('ZSCORE', slots, id))
local found = old ~= nil and old > now
if found then
  redis.call('ZADD', slots, int(math.max(old, now + period)), id)
end
local held = redis.call('ZCOUNT', slots, live, '+inf')
local reset_after = 0
if held > 0 then
  reset_after = tonumber(redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')[2]) - now
  if found then redis.call('PEXPIRE', slots, int(reset_after)) end
end
return {found and 1 or 0, limit, math.max(0, limit - held), reset_after}
