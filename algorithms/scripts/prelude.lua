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

-- MAX_EXACT is algorithms.MaxExact, 2^52: the bound Limit.Validate and
-- Limit.MaxCharge keep every product under, so that each is exact here.
local MAX_EXACT = 4503599627370496

-- ceil(x / y) for integers x and y > 0, exact while |x| < 2^53.
local function ceildiv(x, y)
  return math.floor((x + y - 1) / y)
end

-- Numbers reach Redis as exact integer text: tostring keeps only 14
-- significant digits, %d writes the whole integer (every number here is one,
-- below 2^53 in magnitude) and costs less than a float format.
local function int(x)
  return string.format("%d", x)
end

-- State is a STRING of two or three integers separated by spaces, read and
-- written whole: one GET and one SET (whose PX sets the TTL in the same
-- command) cost Redis less than HMGET, HSET and PEXPIRE.
local state_patterns = {[2] = '^(%-?%d+) (%-?%d+)$', [3] = '^(%-?%d+) (%-?%d+) (%-?%d+)$'}

-- encode is the state value of the integers x, y and (if not nil) z: one
-- format, which costs less than a format per integer and concatenation.
local function encode(x, y, z)
  if z then return string.format('%d %d %d', x, y, z) end
  return string.format('%d %d', x, y)
end

-- parse returns the n (2 or 3) integers of the state value v of key. A
-- value of another shape is an error.
--
-- A value that starts with "r" is a fresh state a node wrote with a plain
-- SET ... PX ttl NX (no script, so no TIME: algorithms/fresh.go):
-- "r<ttl> " then the n integers, field tf (a time in ms) written as an
-- offset from the write's own time. That time is the key's expire time
-- less ttl (PEXPIRETIME: Redis's clock, as TIME is, and the same on a
-- replica or after a restart from the AOF, which keep the absolute expire
-- time), so the state reads exactly as if a script had written it then.
-- Only a script whose state has a time field (tf) reads one; no script
-- ever writes one (save and check_state write absolute times).
local function parse(key, v, n, tf)
  if string.byte(v, 1) == 114 then -- "r"
    local ttl, rest = string.match(v, '^r(%d+) (.*)$')
    local exp = ttl and tf and redis.call('PEXPIRETIME', key)
    if not exp or exp < 0 then error('malformed state in ' .. key) end
    local f = {string.match(rest, state_patterns[n])}
    if not f[1] then error('malformed state in ' .. key) end
    for i = 1, n do f[i] = tonumber(f[i]) end
    f[tf] = f[tf] + exp - tonumber(ttl)
    return f[1], f[2], f[3]
  end
  local x, y, z = string.match(v, state_patterns[n])
  if not x then error('malformed state in ' .. key) end
  return tonumber(x), tonumber(y), z and tonumber(z)
end

-- load returns whether key holds a state and, if so, its n integers (tf:
-- see parse). A key of another type is an error (WRONGTYPE).
local function load(key, n, tf)
  local v = redis.call('GET', key)
  if not v then return false end
  return true, parse(key, v, n, tf)
end

-- save writes the integers x, y and (if not nil) z as key's state, keeping
-- the key's TTL (a release's write).
local function save(key, x, y, z)
  redis.call('SET', key, encode(x, y, z), 'KEEPTTL')
end

-- check_state runs a check whose state is the n integers at key (tf: see
-- parse).
-- decide(found, x, y, z) returns the check's reply for the state (found
-- false: a missing key, the fresh state) and, when the check writes, the
-- new state's value and its TTL in ms. A cold key is the common case, so
-- the fresh state is decided first: when that writes, one SET ... NX GET
-- writes it if the key is missing and otherwise reads what is there,
-- without writing. Only a key that exists costs a second command, the
-- write its own decision makes, if any. Needs Redis 7.0 (NX with GET).
local function check_state(key, n, decide, tf)
  local reply, v, ttl = decide(false)
  local old
  if v then
    old = redis.call('SET', key, v, 'PX', int(ttl), 'NX', 'GET')
  else
    old = redis.call('GET', key)
  end
  if not old then return reply end
  reply, v, ttl = decide(true, parse(key, old, n, tf))
  if v then redis.call('SET', key, v, 'PX', int(ttl)) end
  return reply
end

-- window_key is the key of the window of period p that starts at w, of a
-- window algorithm (the fixed window, the sliding counter) where
-- any_window is the key of one of its windows or their prefix, base:fw4 or
-- base:sc4 (algorithms.WindowKey: prefix:p:w). A prefix ends in the
-- algorithm's suffix, never in ":<digits>:<digits>".
local function window_key(any_window, p, w)
  local prefix = string.match(any_window, '^(.*):%d+:%-?%d+$') or any_window
  return prefix .. ':' .. int(p) .. ':' .. int(w)
end

-- window_count returns the integer count a window's key holds (0 if it is
-- missing): a window algorithm's STRING, which plain INCRBY and DECRBY
-- write too. A value of another shape is an error.
local function window_count(key)
  local v = redis.call('GET', key)
  if not v then return 0 end
  local n = tonumber(string.match(v, '^%-?%d+$'))
  if not n then error('malformed state in ' .. key) end
  return n
end

-- log_meta returns whether a sliding log's meta key holds its usual state
-- and, if so, its sum and seq. Beside a log that has entries, a meta key in
-- the fresh form can only be a fresh write made after an evicting Redis
-- took the meta key alone (the two keys otherwise live and die together):
-- it reads as missing, so that the caller rebuilds the state from the log
-- rather than fail every check until the key expires. Its one entry, in no
-- log, goes uncounted: the eviction loosened the limit by it.
local function log_meta(meta)
  local v = redis.call('GET', meta)
  if not v or string.byte(v, 1) == 114 then return false end
  return true, parse(meta, v, 2)
end

-- log_fresh turns a sliding log's fresh form into its usual state: a log
-- with no entries whose meta is "r<ttl> sum seq ts" (algorithms.Fresh: a
-- plain SET ... NX wrote the log's one entry into the meta key alone) gets
-- that entry, "seq:sum" at ts, expiring when the meta key does, and the
-- meta key its usual "sum seq". Any other state is left as it is. It
-- reports whether it wrote the entry. (The check script reads the fresh
-- form where it is, and writes its entry only when the check writes.)
local function log_fresh(log, meta)
  if redis.call('EXISTS', log) == 1 then return false end
  local v = redis.call('GET', meta)
  if not v or string.byte(v, 1) ~= 114 then return false end
  local sum, seq, ts = parse(meta, v, 3, 3)
  local exp = redis.call('PEXPIRETIME', meta)
  redis.call('ZADD', log, int(ts), int(seq) .. ':' .. int(sum))
  redis.call('PEXPIREAT', log, exp)
  redis.call('SET', meta, encode(sum, seq), 'KEEPTTL')
  return true
end

-- The script:
