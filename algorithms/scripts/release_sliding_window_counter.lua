-- Sliding window counter release: gives back unused units of a lease grant
-- to the window they were taken in, while it is the current one. The rules,
-- shared with the Go model (SlidingCounterState.Release), are
-- docs/algorithms.md, "Leases".
--
-- KEYS[1]  the key of the grant's window (ReleaseKeys), or the windows'
--          prefix (see sliding_window_counter.lua)
-- ARGV     limit, period_ms, capacity, units, a, b, now_ms ("" = Redis TIME),
--          ref (the grant's window start), granted
-- Reply    {returned}
--
-- Never creates the key and sets no TTL: DECRBY keeps the one the check set.

local period = tonumber(ARGV[2])
-- Never more than the grant took, nor than any grant can hold.
local units = math.min(tonumber(ARGV[4]), tonumber(ARGV[9]), tonumber(ARGV[3]))
local now = now_ms(ARGV[7])
local ref = tonumber(ARGV[8])

if units <= 0 then return {0} end
-- Once the grant's window has ended its units count as the previous
-- window's, which spending them there would have made them too.
local w = now - now % period
if w ~= ref then return {0} end
local key = window_key(KEYS[1], period, w)
-- The stored count, not the one a check reads capped under a smaller limit:
-- reducing the capped one could read looser than the count without them.
local returned = math.min(units, window_count(key))
if returned <= 0 then return {0} end
redis.call('DECRBY', key, int(returned))
return {returned}
