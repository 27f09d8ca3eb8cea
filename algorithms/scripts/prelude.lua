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

-- State is a STRING of two or three integers separated by spaces, read and
-- written whole: one GET and one SET (whose PX sets the TTL in the same
-- command) cost Redis less than HMGET, HSET and PEXPIRE.
local state_patterns = {[2] = '^(%-?%d+) (%-?%d+)$', [3] = '^(%-?%d+) (%-?%d+) (%-?%d+)$'}

-- load returns whether key holds a state and, if so, its n (2 or 3)
-- integers. A value of another shape is an error; a key of another type is
-- one already (WRONGTYPE).
local function load(key, n)
  local v = redis.call('GET', key)
  if not v then return false end
  local x, y, z = string.match(v, state_patterns[n])
  if not x then error('malformed state in ' .. key) end
  return true, tonumber(x), tonumber(y), z and tonumber(z)
end

-- save writes the integers x, y and (if not nil) z as key's state, with a
-- TTL of ttl ms, or keeping the key's TTL when ttl is nil.
local function save(key, ttl, x, y, z)
  local v = int(x) .. ' ' .. int(y)
  if z then v = v .. ' ' .. int(z) end
  if ttl then
    redis.call('SET', key, v, 'PX', int(ttl))
  else
    redis.call('SET', key, v, 'KEEPTTL')
  end
end

-- The script:
