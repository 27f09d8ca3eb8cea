-- Concurrency release: frees a held slot. A slot that is unknown, already
-- released or expired frees nothing, so no release can free a slot someone
-- else holds. The rules, shared with the Go model
-- (ConcurrencyState.Release), are docs/algorithms.md, "Concurrency".
--
-- KEYS[1]  base:cc  ZSET, one member per slot: its id, scored by its expiry
-- ARGV     limit, period_ms, cost (ignored), now_ms ("" = Redis TIME), id
-- Reply    {held (0|1), limit, remaining, reset_after_ms}
--
-- Never creates the key and sets no TTL: ZREM keeps the key's TTL, and
-- Redis deletes the set when its last member goes.

local slots = KEYS[1]
local limit = tonumber(ARGV[1])
local now = now_ms(ARGV[4])
local id = ARGV[5]
local live = '(' .. int(now)

local old = tonumber(redis.call('ZSCORE', slots, id))
local found = old ~= nil and old > now
if found then redis.call('ZREM', slots, id) end
local held = redis.call('ZCOUNT', slots, live, '+inf')
local reset_after = 0
if held > 0 then
  reset_after = tonumber(redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')[2]) - now
end
return {found and 1 or 0, limit, math.max(0, limit - held), reset_after}
