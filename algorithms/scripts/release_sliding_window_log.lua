-- Sliding window log release: shrinks a lease grant's entry by the units
-- given back, keeping its timestamp, or removes it when all are. The rules,
-- shared with the Go model (SlidingLogState.Release), are docs/algorithms.md,
-- "Leases".
--
-- KEYS[1]  base:sl3   ZSET, one member "seq:cost" per admitted request, score
--                     ts
-- KEYS[2]  base:slm3  STRING "sum seq" (prelude: log_meta, save; or its fresh form, log_fresh): sum = total
--                     cost in the log, seq = last seq used
-- ARGV     limit, period_ms, capacity, units, a, b, now_ms ("" = Redis TIME),
--          ref (the grant's seq), granted
-- Reply    {returned}
--
-- Never creates a key and sets no TTL: the new member is added before the old
-- one is removed, so the log never empties in between (ZADD to an existing
-- set keeps its TTL), and the state is updated only if it exists.

local log, meta = KEYS[1], KEYS[2]
local period = tonumber(ARGV[2])
local granted = tonumber(ARGV[9])
-- Never more than the grant took, nor than any grant can hold.
local units = math.min(tonumber(ARGV[4]), granted, tonumber(ARGV[3]))
local now = now_ms(ARGV[7])
local ref = tonumber(ARGV[8])

if units <= 0 then return {0} end
log_fresh(log, meta)
local member = int(ref) .. ':' .. int(granted)
local ts = redis.call('ZSCORE', log, member)
-- Gone (expired with the key, or already released), or expired: its units
-- no longer count, so giving them back makes no difference.
if not ts then return {0} end
ts = tonumber(ts)
if ts <= now - period then return {0} end
if granted - units > 0 then
  redis.call('ZADD', log, int(ts), int(ref) .. ':' .. int(granted - units))
end
redis.call('ZREM', log, member)
-- A meta key lost to an eviction is rebuilt by the next check (prelude:
-- log_meta).
local found, sum, seq = log_meta(meta)
if found then save(meta, sum - units, seq) end
return {units}
