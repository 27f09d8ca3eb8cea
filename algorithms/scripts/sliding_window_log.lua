-- Sliding window log: at most `limit` units admitted in any rolling `period`
-- ms, from a log of every admitted request. The exact rules, shared with the
-- Go model (algorithms/sliding_window_log.go), are docs/algorithms.md,
-- "Sliding window log".
--
-- KEYS[1]  base:sl4   ZSET, one member "seq:cost" per admitted request or
--                     lease grant, score ts: a log longer than LOG_INLINE
-- KEYS[2]  base:slm4  STRING: a log of up to LOG_INLINE entries, "L<seq>
--                     ts:seq:cost ..." (or its fresh form); "sum seq" beside
--                     the ZSET, sum = total cost in it (prelude: log_read);
--                     seq = the last seq used
-- ARGV     limit, period_ms, capacity, cost, a, b, now_ms ("" = Redis TIME),
--          want (units a lease would like, >= cost; missing = cost),
--          hold_ms (how long a lease keeps them; missing = 0), charge (1: a
--          cost that does not fit is recorded all the same; State.Charge)
-- Reply    {allowed (0|1), limit, remaining, reset_after_ms, retry_after_ms,
--          granted, use_within_ms, ref (the entry's seq)}; see
--          docs/algorithms.md, "Leases"
--
-- An entry counts while ts > now - period. A lease grant's entry is recorded
-- at ts = now + hold_ms, the lease's end, so that however late in the lease a
-- unit is spent it stays in the window a period after; without a hold there
-- is no end to record at, and it grants only cost. A charge that does not
-- fit joins the newest entry (moved to now if older, under a new seq) rather
-- than add one, so the log stays about limit entries long.

local log, meta = KEYS[1], KEYS[2]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[4])
local now = now_ms(ARGV[7])
local want = tonumber(ARGV[8]) or cost
-- Clamped to the longest period, which keeps now + hold exact.
local hold = math.max(0, math.min(tonumber(ARGV[9]) or 0, 31536000000))
local charge = tonumber(ARGV[10]) == 1
local c = math.max(cost, 1)

local function cost_of(member) return tonumber(string.match(member, ':(%d+)$')) end

-- bytes_less orders two members as a sorted set orders equal scores.
local function bytes_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- The log as this check reads it: entries, the inline log (prelude:
-- log_read), or nil when it lives in the sorted set. A sorted set's sum
-- and seq are read only when the set is non-empty, so that a state left
-- behind by a lost log cannot count entries that are gone.
local sum, seq, newest, newest_member = 0, 0, 0, nil
local cutoff = now - period
local entries
local expired = {}    -- sorted set: the members that have expired
local n_expired = 0   -- inline: how many entries, from the first, have expired
local v = redis.call('GET', meta)
if v then seq, entries = log_read(meta, v) end
if not entries then
  local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #last == 0 then
    -- No log, or a lost one: nothing counts.
    seq, entries = 0, {}
  else
    newest, newest_member = tonumber(last[2]), last[1]
    if v then
      sum, seq = parse(meta, v, 2)
    else
      -- The two keys always expire together, but an eviction can take one:
      -- rebuild the state from the log rather than trust a missing sum.
      for _, member in ipairs(redis.call('ZRANGE', log, 0, -1)) do
        local s, n = string.match(member, '^(%d+):(%d+)$')
        sum, seq = sum + tonumber(n), math.max(seq, tonumber(s))
      end
    end
    -- Entries with ts <= now - period have expired; they are the lowest
    -- scores.
    expired = redis.call('ZRANGEBYSCORE', log, '-inf', int(cutoff))
    for _, member in ipairs(expired) do sum = sum - cost_of(member) end
  end
end
if entries then
  for i, e in ipairs(entries) do
    if e[1] <= cutoff then n_expired = i else sum = sum + e[3] end
  end
  -- The newest entry, as a sorted set orders them: by ts (the last
  -- entries'), then member.
  local n = #entries
  if n > 0 then
    newest = entries[n][1]
    newest_member = int(entries[n][2]) .. ':' .. int(entries[n][3])
    for i = n - 1, 1, -1 do
      local e = entries[i]
      if e[1] < newest then break end
      local member = int(e[2]) .. ':' .. int(e[3])
      if bytes_less(newest_member, member) then newest_member = member end
    end
  end
end

-- Expired entries are dropped only when the check writes anyway: a denial
-- or a cost-0 check writes nothing, as in the Go model, so the two agree
-- even when the clock steps back over an expiry.
local function drop_expired()
  if entries then
    local kept = {}
    for i = n_expired + 1, #entries do kept[#kept + 1] = entries[i] end
    entries, n_expired = kept, 0
  elseif #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', int(cutoff))
    expired = {}
  end
end

-- add records an entry of units at ts under seq q: inline, after the
-- entries of a ts up to its own.
local function add(ts, q, units)
  if not entries then
    redis.call('ZADD', log, int(ts), int(q) .. ':' .. int(units))
    return
  end
  local i = #entries
  while i > 0 and entries[i][1] > ts do i = i - 1 end
  table.insert(entries, i + 1, {ts, q, units})
end

-- remove_newest removes the newest entry (a charge joins it).
local function remove_newest()
  if not entries then
    redis.call('ZREM', log, newest_member)
    return
  end
  for i = #entries, 1, -1 do
    local e = entries[i]
    if e[1] == newest and int(e[2]) .. ':' .. int(e[3]) == newest_member then
      table.remove(entries, i)
      return
    end
  end
end

-- store keeps the log for ttl ms: inline while it is short enough, or in
-- the sorted set, which an inline log that outgrows LOG_INLINE spills into.
local function store(ttl)
  if entries and #entries <= LOG_INLINE then
    redis.call('SET', meta, log_inline_value(seq, entries), 'PX', int(ttl))
    return
  end
  if entries then
    local args = {}
    for _, e in ipairs(entries) do
      args[#args + 1] = int(e[1])
      args[#args + 1] = int(e[2]) .. ':' .. int(e[3])
    end
    -- Whatever an eviction may have left there is not the log.
    redis.call('DEL', log)
    redis.call('ZADD', log, unpack(args))
  end
  redis.call('PEXPIRE', log, int(ttl))
  redis.call('SET', meta, encode(sum, seq), 'PX', int(ttl))
end

local allowed = sum + c <= limit
local granted, use_within, ref = 0, 0, 0
if allowed and cost > 0 then
  granted, use_within = cost, hold
  if hold > 0 then granted = math.max(cost, math.min(want, limit - sum)) end
  drop_expired()
  -- Seqs restart once every entry has expired (newest <= now - period),
  -- alike whether the keys have expired yet or not.
  if newest <= now - period then seq = 0 end
  seq, sum = seq + 1, sum + granted
  ref = seq
  -- If every entry had expired, newest <= now - period < now + hold.
  newest = math.max(newest, now + hold)
  add(now + hold, seq, granted)
  store(newest + period - now)
elseif cost > 0 and charge then
  local units = math.min(cost, MAX_EXACT - sum)
  drop_expired()
  if newest <= now - period then
    -- No entry counts (or the log is empty): the charge is the first.
    seq, sum, newest = 1, units, now
    add(now, 1, units)
  else
    -- The newest entry takes the units, under a new seq so that no
    -- grant's release finds it.
    local merged = cost_of(newest_member) + units
    remove_newest()
    seq, sum, newest = seq + 1, sum + units, math.max(newest, now)
    add(newest, seq, merged)
  end
  store(newest + period - now)
end

local reset_after, retry_after = 0, 0
if sum > 0 then reset_after = newest + period - now end
if not allowed and c > limit then
  -- A charge that can never fit: when the quota is whole again.
  retry_after = reset_after
elseif not allowed then
  -- The same cost fits once the oldest live entries worth `need` units
  -- have expired, at their ts + period. Equal scores expire together, so
  -- their order within the set does not matter. Read in chunks, after the
  -- expired entries: the walk usually stops early.
  local need, freed = sum + c - limit, 0
  if entries then
    for i = n_expired + 1, #entries do
      freed = freed + entries[i][3]
      if freed >= need then
        retry_after = entries[i][1] + period - now
        break
      end
    end
  end
  local from, chunk = #expired, 128
  while not entries and retry_after == 0 do
    local page = redis.call('ZRANGE', log, from, from + chunk - 1, 'WITHSCORES')
    if #page == 0 then break end
    for i = 1, #page, 2 do
      freed = freed + cost_of(page[i])
      if freed >= need then
        retry_after = tonumber(page[i + 1]) + period - now
        break
      end
    end
    from = from + chunk
  end
end
-- sum exceeds limit only when the key's limit shrank since it was spent.
return {allowed and 1 or 0, limit, math.max(0, limit - sum), reset_after, retry_after,
  granted, use_within, ref}
