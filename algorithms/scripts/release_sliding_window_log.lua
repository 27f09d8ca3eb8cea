-- Sliding window log release: shrinks a lease grant's entry by the units
-- given back, keeping its timestamp, or removes it when all are. The rules,
-- shared with the Go model (SlidingLogState.Release), are docs/algorithms.md,
-- "Leases".
--
-- KEYS[1]  base:sl4   ZSET, one member "seq:cost" per admitted request, score
--                     ts: a log longer than LOG_INLINE
-- KEYS[2]  base:slm4  STRING: an inline log "L<seq> ts:seq:cost ..." (or its
--                     fresh form), or "sum seq" beside the ZSET (see
--                     sliding_window_log.lua)
-- ARGV     limit, period_ms, capacity, units, a, b, now_ms ("" = Redis TIME),
--          ref (the grant's seq), granted
-- Reply    {returned}
--
-- Never creates a key and sets no TTL: an inline log is written back with
-- its TTL kept; in the ZSET the new member is added before the old one is
-- removed, so the log never empties in between (ZADD to an existing set
-- keeps its TTL), and the state is updated only if it exists.

local log, meta = KEYS[1], KEYS[2]
local period = tonumber(ARGV[2])
local granted = tonumber(ARGV[9])
-- Never more than the grant took, nor than any grant can hold.
local units = math.min(tonumber(ARGV[4]), granted, tonumber(ARGV[3]))
local now = now_ms(ARGV[7])
local ref = tonumber(ARGV[8])

if units <= 0 then return {0} end
local v = redis.call('GET', meta)
local seq, entries
if v then seq, entries = log_read(meta, v) end
if entries then
  for i, e in ipairs(entries) do
    if e[2] == ref and e[3] == granted then
      -- Expired: its units no longer count, so giving them back makes no
      -- difference.
      if e[1] <= now - period then return {0} end
      if granted - units > 0 then
        e[3] = granted - units
      else
        table.remove(entries, i)
      end
      redis.call('SET', meta, log_inline_value(seq, entries), 'KEEPTTL')
      return {units}
    end
  end
  -- Gone (expired with the key, or already released).
  return {0}
end
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
if v then
  local sum
  sum, seq = parse(meta, v, 2)
  save(meta, sum - units, seq)
end
return {units}
