-- Fixed window: at most `limit` units in each window of `period` ms, windows
-- aligned to multiples of the period since the epoch. The exact rules, shared
-- with the Go model (algorithms/fixed_window.go), are docs/algorithms.md,
-- "Fixed window".
--
-- KEYS[1]  base:fw3  STRING "w n": w = window start ms, n = units spent in
--          window w (prelude: load, save; or its fresh form, parse)
-- ARGV     limit, period_ms, capacity, cost, a, b, now_ms ("" = Redis TIME),
--          want (units a lease would like, >= cost; missing = cost),
--          hold_ms (how long a lease keeps them; missing = 0), charge (1: a
--          cost that does not fit is recorded all the same; State.Charge)
-- Reply    {allowed (0|1), limit, remaining, reset_after_ms, retry_after_ms,
--          granted, use_within_ms, ref}; see docs/algorithms.md, "Leases"

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[4])
local now = now_ms(ARGV[7])
local want = tonumber(ARGV[8]) or cost
local charge = tonumber(ARGV[10]) == 1
local c = math.max(cost, 1)

-- decide: see check_state (prelude). st_w and st_n are the stored w and n.
local function decide(found, st_w, st_n)
  -- The stored window, aligned to this limit's period: a no-op unless the key's
  -- period changed. A clock that went backwards stays in the newest window
  -- written, so it can never reopen (and spend again) an earlier one.
  local stored_w = (found and st_w or 0)
  stored_w = stored_w - stored_w % period
  local w = math.max(now - now % period, stored_w)
  local used = 0
  if w == stored_w then used = found and st_n or 0 end

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

  local reset_after, retry_after = 0, 0
  if used > 0 then reset_after = w + period - now end
  -- The next window is empty: its start is the earliest fit, or (c > limit,
  -- a charge) when the quota is whole.
  if not allowed then retry_after = w + period - now end
  -- used exceeds limit after a charge, or when the key's limit shrank.
  local reply = {allowed and 1 or 0, limit, math.max(0, limit - used), reset_after,
    retry_after, granted, use_within, ref}
  if granted > 0 or charged then
    return reply, encode(w, used), math.max(1, w + period - now)
  end
  return reply
end

return check_state(key, 2, decide, 1)
