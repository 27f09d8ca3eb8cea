-- Prelude: embedded ahead of every check and release script (script.go), so
-- the helpers below exist once. Redis runs each script as one chunk, so
-- these locals are in scope for the script that follows.

-- now_ms returns the test-only `now` argument, or Redis TIME in whole ms:
-- one clock for every node.
local function now_ms(arg)
  local now = tonumber(arg)
  if now then return now end
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- ceil(x / y) for integers x and y > 0, exact while |x| < 2^53.
local function ceildiv(x, y)
  return math.floor((x + y - 1) / y)
end

-- Numbers reach Redis as exact integer text: tostring keeps only 14
-- significant digits, %.0f writes the whole integer.
local function int(x)
  return string.format("%.0f", x)
end

-- note_variant is called by every check script right after it writes its
-- state with a TTL of ttl ms. When the check names a variant of its limit
-- (ARGV[10], an inline limit's "/limit/period/capacity"; absent for a
-- configured policy), it records the variant in the SET `variants` (the
-- key after the script's own, base family..":il") and keeps that SET at
-- least as long as the state, so that a reset of the family finds it.
local function note_variant(variants, ttl)
  local variant = ARGV[10]
  if variant == nil or variant == '' then return end
  redis.call('SADD', variants, variant)
  if redis.call('PTTL', variants) < ttl then
    redis.call('PEXPIRE', variants, int(ttl))
  end
end

-- The script:
