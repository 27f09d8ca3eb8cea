-- Prelude: embedded ahead of every check and release script (script.go), so
-- the helpers below exist once. Redis runs each script as one chunk, so
-- these locals are in scope for the script that follows.

-- now_ms returns the test-only `now` argument, or Redis TIME in whole ms:
-- one clock for every node. TIME is read once per script call: the checks
-- one batch script decides (script.go, BatchCheckScript) all happen at the
-- same millisecond, one Redis TIME could have given each of them.
local time_ms
local function now_ms(arg)
  local now = tonumber(arg)
  if now then return now end
  if not time_ms then
    local t = redis.call("TIME")
    time_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return time_ms
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

-- The script:
