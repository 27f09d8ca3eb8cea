-- Fixed window: at most `limit` units in each window of `period` ms, windows
-- aligned to multiples of the period since the epoch. The exact rules, shared
-- with the Go model (algorithms/fixed_window.go), are docs/algorithms.md,
-- "Fixed window".
--
-- KEYS[1]  the key of the window the caller expects now (ScriptKeys), or
--          base:fw4, the windows' prefix: the window of period p that starts
--          at w is the STRING base:fw4:p:w (algorithms.WindowKey), the
--          integer count of units spent in it, expiring at the window's end.
--          Plain INCRBY and DECRBY of a node far from the window's edge
--          (algorithms.WindowIncrement) write the same key. The script uses
--          the window of its own clock, which near an edge may be the one
--          next to KEYS[1]'s: in KEYS[1]'s hash tag, so in its slot.
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

-- The window of now, and what was spent in it: a count plain commands wrote
-- may lie outside [0, MAX_EXACT] for a moment (a give-back not yet made).
local w = now - now % period
local key = window_key(KEYS[1], period, w)
local stored = window_count(key)
local used = math.min(math.max(stored, 0), MAX_EXACT)

local allowed = used + c <= limit
local granted, use_within, ref = 0, 0, 0
if allowed and cost > 0 then
  -- A lease takes up to want of what is left; its units belong to window w
  -- and must not be spent in the next, which would admit them again.
  granted = math.max(cost, math.min(want, limit - used))
  use_within, ref = w + period - now, w
  used = used + granted
end
local charged = not allowed and charge and cost > 0
if charged then used = math.min(used + cost, MAX_EXACT) end

if granted > 0 or charged then
  -- By the difference, so that a plain give-back still on its way lands on
  -- what it took from.
  redis.call('INCRBY', key, int(used - math.min(math.max(stored, 0), MAX_EXACT)))
  -- The window's end, on the script's clock.
  redis.call('PEXPIRE', key, int(w + period - now))
end

local reset_after, retry_after = 0, 0
if used > 0 then reset_after = w + period - now end
-- The next window is empty: its start is the earliest fit, or (c > limit,
-- a charge) when the quota is whole.
if not allowed then retry_after = w + period - now end
-- used exceeds limit after a charge, or when the key's limit shrank.
return {allowed and 1 or 0, limit, math.max(0, limit - used), reset_after,
  retry_after, granted, use_within, ref}
