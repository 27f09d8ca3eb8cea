-- Leaky bucket release: drains to now as a check does, then takes unused
-- units of a lease grant out, down to an empty bucket. The rules, shared with
-- the Go model (LeakyBucketState.Release), are docs/algorithms.md, "Leases".
--
-- KEYS[1]  base..":lb3", a STRING "l d ts" (prelude: parse, save): l = level
--          rounded up, d = how much of the top unit has drained in 1/b units
--          (0 <= d < b), ts = time of the last drain in ms. A missing key is an
--          empty bucket.
-- ARGV     limit, period_ms, capacity, units, a, b, now_ms ("" reads TIME),
--          ref (unused), granted
-- Reply    {returned}: the units taken out before the bucket was empty
--
-- Never creates the key and sets no TTL: SET KEEPTTL keeps the one the check set.

local key = KEYS[1]
local capacity = tonumber(ARGV[3])
-- Never more than the grant took, nor than any grant can hold.
local units = math.min(tonumber(ARGV[4]), tonumber(ARGV[9]), capacity)
local a = tonumber(ARGV[5])
local b = tonumber(ARGV[6])
local now = now_ms(ARGV[7])

if units <= 0 then return {0} end
local found, level, d, last = load(key, 3, 3)
-- A missing key is an empty bucket already.
if not found then return {0} end
-- A level above Limit.MaxCharge was written under another limit and is read
-- clamped; taking units from the clamped level could read looser than the
-- level without them, so leave it. (Above the capacity and up to it, the
-- level is a charge's debt and counts in full.)
if level > math.floor(MAX_EXACT / b) then return {0} end
-- Drain exactly as the check does.
d = math.min(d, b - 1)
local e = math.max(0, now - last)
if e >= ceildiv(level * b - d, a) then
  level, d = 0, 0
else
  local acc = d + e * a
  local whole = math.floor(acc / b)
  level, d = level - whole, acc - whole * b
end
last = math.max(last, now)

if level <= 0 then return {0} end
local returned = math.min(units, level)
level = level - units
if level <= 0 then level, d = 0, 0 end
save(key, level, d, last)
return {returned}
