-- Sliding window counter release: gives back unused units of a lease grant
-- to the window they were taken in, while it is the current one. The rules,
-- shared with the Go model (SlidingCounterState.Release), are
-- docs/algorithms.md, "Leases".
--
-- KEYS[1]  base:sc3  STRING "w cur prev": w = current window start ms, cur =
--          units spent in window w, prev = units spent in window w - period
--          (prelude: load, save; or its fresh form, parse)
-- ARGV     limit, period_ms, capacity, units, a, b, now_ms ("" = Redis TIME),
--          ref (the grant's window start), granted
-- Reply    {returned}
--
-- Never creates the key and sets no TTL: SET KEEPTTL keeps the one the check set.

local key = KEYS[1]
local period = tonumber(ARGV[2])
-- Never more than the grant took, nor than any grant can hold.
local units = math.min(tonumber(ARGV[4]), tonumber(ARGV[9]), tonumber(ARGV[3]))
local now = now_ms(ARGV[7])
local ref = tonumber(ARGV[8])

if units <= 0 then return {0} end
local found, raw_w, cur, prev = load(key, 3, 1)
-- A missing key counts nothing already.
if not found then return {0} end
-- The current window as the check computes it.
local stored_w = raw_w - raw_w % period
local w = math.max(now - now % period, stored_w)
-- Once the grant's window has ended its units count as the previous
-- window's, which spending them there would have made them too.
if w ~= ref or w ~= stored_w then return {0} end
-- The stored count, not the one a check reads capped under a smaller limit:
-- reducing the capped one could read looser than the count without them.
local returned = math.min(units, cur)
if returned <= 0 then return {0} end
save(key, raw_w, cur - returned, prev)
return {returned}
