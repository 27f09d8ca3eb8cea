-- GCRA release: moves the theoretical arrival time back by the emission
-- intervals of unused units of a lease grant, but not before now. The rules,
-- shared with the Go model (GCRAState.Release), are docs/algorithms.md,
-- "Leases".
--
-- KEYS[1]  base..":gc3", a STRING "tat r" (prelude: parse, save): tat = whole
--          ms of tat, r = its fraction in 1/a ms (0 <= r < a). A missing key
--          is tat = now.
-- ARGV     limit, period_ms, capacity, units, a, b, now_ms ("" reads TIME),
--          ref (unused), granted
-- Reply    {returned}: the units whose emission had not passed, a partly
--          passed one counting as one
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
local found, tat, r = load(key, 2, 1)
-- A missing key is tat = now already.
if not found then return {0} end
-- top is the furthest a check puts tat beyond now: Limit.MaxCharge * T.
local top = math.floor(MAX_EXACT / b) * b
-- x, how far tat lies beyond now in 1/a ms, read as the check does. A tat
-- the check reads capped (the clock went backwards or the limit changed) is
-- left alone: moving it back from the cap could read looser than the tat
-- without those units.
local ahead = tat - now
if ahead < 0 or ahead > math.floor(top / a) then return {0} end
local x = ahead * a + math.min(r, a - 1)
if x <= 0 or x > top then return {0} end

local returned = math.min(units, ceildiv(x, b))
x = math.max(0, x - units * b)
local whole = math.floor(x / a)
save(key, now + whole, x - whole * a)
return {returned}
