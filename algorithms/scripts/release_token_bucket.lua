-- Token bucket release: refills to now as a check does, then puts unused
-- units of a lease grant back, up to a full bucket. The rules, shared with
-- the Go model (TokenBucketState.Release), are docs/algorithms.md, "Leases".
--
-- KEYS[1]  base..":tb3", a STRING "t r ts" (prelude: parse, save): t = whole
--          tokens, r = the part of the next token refilled so far in 1/b
--          tokens (0 <= r < b), ts = time of the last refill in ms. A missing
--          key is a full bucket.
-- ARGV     limit, period_ms, capacity, units, a, b, now_ms ("" reads TIME),
--          ref (unused), granted
-- Reply    {returned}: the units put back before the bucket was full
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
local found, tokens, r, last = load(key, 3, 3)
-- A missing key is a full bucket already.
if not found then return {0} end
-- Read and refill exactly as the check does.
tokens = math.max(math.min(tokens, capacity), capacity - math.floor(MAX_EXACT / b))
r = math.min(r, b - 1)
local e = math.max(0, now - last)
if e >= ceildiv((capacity - tokens) * b - r, a) then
  tokens, r = capacity, 0
else
  local acc = r + e * a
  local whole = math.floor(acc / b)
  tokens, r = tokens + whole, acc - whole * b
end
last = math.max(last, now)

local returned = math.min(units, capacity - tokens)
if returned <= 0 then return {0} end
tokens = tokens + units
if tokens >= capacity then tokens, r = capacity, 0 end
save(key, tokens, r, last)
return {returned}
