-- Sliding window counter: the previous aligned window's count, weighted by
-- how much of it the rolling period still covers, plus the current window's
-- count stays within `limit`. The exact rules, shared with the Go model
-- (algorithms/sliding_window_counter.go), are docs/algorithms.md,
-- "Sliding window counter".
--
-- KEYS[1]  the key of the window the caller expects now (ScriptKeys), or
--          base:sc4, the windows' prefix: the window of period p that starts
--          at w is the STRING base:sc4:p:w (algorithms.WindowKey), the
--          integer count of units spent in it, expiring a period after the
--          window's end (it is the previous window then). Plain INCRBY and
--          DECRBY of a node far from the window's edge
--          (algorithms.WindowIncrement) write the same keys. The script
--          uses the windows of its own clock: in KEYS[1]'s hash tag, so in
--          its slot.
-- ARGV     limit, period_ms, capacity, cost, a, b, now_ms ("" = Redis TIME),
--          want (units a lease would like, >= cost; missing = cost),
--          hold_ms (how long a lease keeps them; missing = 0), charge (1: a
--          cost that does not fit is recorded all the same; State.Charge)
-- Reply    {allowed (0|1), limit, remaining, reset_after_ms, retry_after_ms,
--          granted, use_within_ms, ref}; see docs/algorithms.md, "Leases"

local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[4])
local now = now_ms(ARGV[7])
local want = tonumber(ARGV[8]) or cost
local charge = tonumber(ARGV[10]) == 1
local c = math.max(cost, 1)
-- Limit.MaxCharge: the most a count may hold, which keeps prev * period
-- within 2^52.
local most = math.floor(MAX_EXACT / period)

local w = now - now % period
local key = window_key(KEYS[1], period, w)
local stored = window_count(key)
-- Counts above the limit are a charge's debt, or were spent under a larger
-- limit (the key's limit changed); a count plain commands wrote may lie
-- outside [0, most] for a moment (a give-back not yet made). Capping them
-- keeps prev * period within 2^52.
local cur = math.min(math.max(stored, 0), most)
local prev = math.min(math.max(window_count(window_key(KEYS[1], period, w - period)), 0), most)
local before = cur

-- The previous window's share, rounded up so the estimate errs strict.
-- prev * (period - e) <= most * period <= 2^52: exact.
local e = math.max(0, now - w)
local pw = math.floor((prev * (period - e) + period - 1) / period)

local allowed = pw + cur + c <= limit
local granted, use_within, ref = 0, 0, 0
if allowed and cost > 0 then
  -- A lease takes up to want of what is left; its units belong to window w
  -- and must not be spent in the next, where they would only count as a
  -- weighted share of the previous window.
  granted = math.max(cost, math.min(want, limit - pw - cur))
  use_within, ref = w + period - now, w
  cur = cur + granted
end
local charged = not allowed and charge and cost > 0
if charged then cur = math.min(cur + cost, most) end

if granted > 0 or charged then
  -- By the difference, so that a plain give-back still on its way lands on
  -- what it took from; the key lives until the end of the next window.
  redis.call('INCRBY', key, int(cur - before))
  redis.call('PEXPIRE', key, int(w + 2 * period - now))
end

local reset_after, retry_after = 0, 0
if cur > 0 then
  reset_after = w + 2 * period - now
elseif prev > 0 then
  reset_after = w + period - now
end
if not allowed and c > limit then
  -- A charge that can never fit: when the quota is whole again.
  retry_after = reset_after
elseif not allowed then
  -- The cost fits at the first e where ceil(n * (period - e) / period) <=
  -- room, i.e. e >= period - floor(room * period / n), n being the count
  -- that is fading out (a charge's debt included). room >= 0 implies
  -- prev > 0, room < 0 implies cur > 0.
  local room = limit - cur - c
  if room >= 0 then
    local k = math.floor(room * period / prev)
    retry_after = w + period - k - now
  else
    -- Only the next window, where prev = cur and cur = 0, has room.
    local k = math.floor((limit - c) * period / cur)
    retry_after = w + period + math.max(0, period - k) - now
  end
end
return {allowed and 1 or 0, limit, math.max(0, limit - pw - cur), reset_after,
  retry_after, granted, use_within, ref}
