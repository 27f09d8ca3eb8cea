-- Sliding window log: at most `limit` units admitted in any rolling `period`
-- ms, from a log of every admitted request. The exact rules, shared with the
-- Go model (algorithms/sliding_window_log.go), are docs/algorithms.md,
-- "Sliding window log".
--
-- KEYS[1]  base:sl3   ZSET, one member "seq:cost" per admitted request or
--                     lease grant, score ts
-- KEYS[2]  base:slm3  STRING "sum seq" (prelude: log_meta, save; or its fresh form, log_fresh): sum = total
--                     cost in the log, seq = last seq used
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

-- sum and seq are read only when the log is non-empty, so that a state left
-- behind by a lost log cannot count entries that are gone.
local sum, seq, newest, newest_member = 0, 0, 0, nil
-- cutoff is now - period as text (entries scored at most it have
-- expired), formatted only where a command sends it: a fresh log's check
-- sends none.
local cutoff
local expired = {}
-- A log still in its fresh form (prelude: log_fresh) has its one entry in
-- the meta key alone: pending_ts and pending_member. The check reads it
-- there and writes it into the log only if the check writes anyway, with
-- its own entry in the same ZADD; a denial leaves the fresh form as it is.
local pending_ts, pending_member
local last = redis.call('ZRANGE', log, '-1', '-1', 'WITHSCORES')
if #last == 0 then
  -- An empty log is a missing key, so the meta key is the whole state.
  local v = redis.call('GET', meta)
  if v and string.byte(v, 1) == 114 then -- "r"
    local ts
    sum, seq, ts = parse(meta, v, 3, 3)
    newest, newest_member = ts, string.format('%d:%d', seq, sum)
    pending_ts, pending_member = ts, newest_member
    if ts <= now - period then
      expired, sum = {newest_member}, 0
    end
  end
else
  newest, newest_member = tonumber(last[2]), last[1]
  local found
  found, sum, seq = log_meta(meta)
  if not found then
    -- The two keys always expire together, but an eviction can take one:
    -- rebuild the state from the log rather than trust a missing sum
    -- (prelude: log_meta).
    sum, seq = 0, 0
    for _, member in ipairs(redis.call('ZRANGE', log, '0', '-1')) do
      local s, n = string.match(member, '^(%d+):(%d+)$')
      sum, seq = sum + tonumber(n), math.max(seq, tonumber(s))
    end
  end
  -- Entries with ts <= now - period have expired; they are the lowest
  -- scores. (An empty log has none.)
  cutoff = int(now - period)
  expired = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  for _, member in ipairs(expired) do sum = sum - cost_of(member) end
end
-- Whether the log holds expired entries to drop when the check writes.
local drop = #expired > 0 and not pending_ts
-- Whether a pending entry still counts: if the check writes, it goes into
-- the log beside the check's own entry, in one ZADD.
local keep = pending_ts and #expired == 0

local allowed = sum + c <= limit
local granted, use_within, ref = 0, 0, 0
if allowed and cost > 0 then
  granted, use_within = cost, hold
  if hold > 0 then granted = math.max(cost, math.min(want, limit - sum)) end
  -- Expired entries are dropped only here, when the check writes anyway:
  -- a denial or a cost-0 check writes nothing, as in the Go model, so the
  -- two agree even when the clock steps back over an expiry.
  if drop then redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff) end
  -- Seqs restart once every entry has expired (newest <= now - period),
  -- alike whether the keys have expired yet or not.
  if newest <= now - period then seq = 0 end
  seq, sum = seq + 1, sum + granted
  ref = seq
  -- If every entry had expired, newest <= now - period < now + hold.
  newest = math.max(newest, now + hold)
  local ttl = int(newest + period - now)
  local member = string.format('%d:%d', seq, granted)
  if keep then
    redis.call('ZADD', log, int(pending_ts), pending_member, int(now + hold), member)
  else
    redis.call('ZADD', log, int(now + hold), member)
  end
  redis.call('PEXPIRE', log, ttl)
  redis.call('SET', meta, encode(sum, seq), 'PX', ttl)
elseif cost > 0 and charge then
  local units = math.min(cost, MAX_EXACT - sum)
  if drop then redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff) end
  expired = {}
  if newest <= now - period then
    -- No entry counts (or the log is empty): the charge is the first.
    seq, sum, newest = 1, units, now
    redis.call('ZADD', log, int(now), '1:' .. int(units))
  else
    -- The newest entry (ZRANGE's last: by score, then member) takes the
    -- units, under a new seq so that no grant's release finds it. (A
    -- pending entry is the newest, and never reaches the log.)
    local merged = cost_of(newest_member) + units
    seq, sum, newest = seq + 1, sum + units, math.max(newest, now)
    if not pending_ts then redis.call('ZREM', log, newest_member) end
    redis.call('ZADD', log, int(newest), string.format('%d:%d', seq, merged))
  end
  local ttl = int(newest + period - now)
  redis.call('PEXPIRE', log, ttl)
  redis.call('SET', meta, encode(sum, seq), 'PX', ttl)
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
  local need, freed, from, chunk = sum + c - limit, 0, #expired, 128
  -- A pending entry counts (sum > 0), so it alone is worth sum >= need.
  if pending_ts then retry_after = pending_ts + period - now end
  while retry_after == 0 do
    local page = redis.call('ZRANGE', log, int(from), int(from + chunk - 1), 'WITHSCORES')
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
