-- Concurrency: at most `limit` slots held at once, each alive `period` ms
-- from its acquire or last renew. The exact rules, shared with the Go model
-- (ConcurrencyState.Acquire in algorithms/concurrency.go), are
-- docs/algorithms.md, "Concurrency".
--
-- KEYS[1]  base:cc  ZSET, one member per slot: its id, scored by its expiry
--                   in ms
-- ARGV     limit, period_ms, cost (0 or 1), now_ms ("" = Redis TIME), id
-- Reply    {allowed (0|1), limit, remaining, reset_after_ms, retry_after_ms}
--
-- A slot counts while expiry > now. Expired slots are dropped only when a
-- slot is taken, so a denial or a cost-0 check writes nothing.

local slots = KEYS[1]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local now = now_ms(ARGV[4])
local id = ARGV[5]
local c = math.max(cost, 1)
local live = '(' .. int(now)

local held = redis.call('ZCOUNT', slots, live, '+inf')
local allowed = held + c <= limit
if allowed and cost > 0 then
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', int(now))
  local exp = now + period
  -- An id that is already held (its taker asked twice) keeps its one slot,
  -- and never expires earlier than it would have.
  local old = tonumber(redis.call('ZSCORE', slots, id))
  if old then
    exp = math.max(exp, old)
  else
    held = held + 1
  end
  redis.call('ZADD', slots, int(exp), id)
end

local reset_after, retry_after = 0, 0
if held > 0 then
  -- The newest expiry is live when any slot is.
  reset_after = tonumber(redis.call('ZRANGE', slots, -1, -1, 'WITHSCORES')[2]) - now
  if allowed and cost > 0 then redis.call('PEXPIRE', slots, int(reset_after)) end
end
if not allowed then
  -- The need-th live slot to expire frees the last slot needed (held >
  -- limit only when the key's limit shrank since they were taken).
  local need = held + c - limit
  local e = redis.call('ZRANGEBYSCORE', slots, live, '+inf', 'WITHSCORES', 'LIMIT', need - 1, 1)
  if #e > 0 then retry_after = tonumber(e[2]) - now end
end
return {allowed and 1 or 0, limit, math.max(0, limit - held), reset_after, retry_after}
