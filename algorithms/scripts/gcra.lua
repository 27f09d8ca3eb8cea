-- GCRA (generic cell rate algorithm): each admitted unit pushes the
-- theoretical arrival time (tat) one emission interval T = b/a ms later; a
-- cost is admitted while tat stays within `capacity` intervals of now. The
-- rules, and the Go model this must match decision for decision, are
-- docs/algorithms.md "GCRA" and algorithms/gcra.go. Decisions equal
-- go-redis/redis_rate's, in whole ms (rounded up) and without its -1
-- sentinels, but for what a denial or cost 0 reports (see gcra.go).
--
-- KEYS[1]  base..":gc3", a STRING "tat r" (prelude: parse, save): tat = whole
--          ms of tat, r = its fraction in 1/a ms (0 <= r < a). A missing key
--          is tat = now.
-- ARGV     limit, period_ms, capacity, cost, a, b, now_ms ("" reads TIME),
--          want (units a lease would like, >= cost; missing = cost), hold_ms
--          (unused: units taken early are only ever more conservative),
--          charge (1: a cost that does not fit pushes tat on all the same,
--          beyond the tolerance; State.Charge)
-- Reply    {allowed (0|1), capacity, remaining, reset_after_ms, retry_after_ms,
--          granted, use_within_ms (0: no bound), ref (0)}; see
--          docs/algorithms.md, "Leases"
--
-- Times relative to now are kept in 1/a ms, so T = b exactly. Integers only:
-- Limit.Validate bounds capacity*b and a by 2^52, so no value here exceeds
-- capacity*b + a <= 2^53 and Lua numbers (doubles) hold every one exactly.

local key = KEYS[1]
local capacity = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local a = tonumber(ARGV[5])
local b = tonumber(ARGV[6])
local now = now_ms(ARGV[7])

local want = tonumber(ARGV[8]) or cost
local charge = tonumber(ARGV[10]) == 1
local c = math.max(cost, 1)
-- full is the whole burst tolerance, capacity * T, in 1/a ms; top the
-- furthest a charge may push tat, Limit.MaxCharge * T (<= 2^52).
local full = capacity * b
local top = math.floor(MAX_EXACT / b) * b

-- decide: see check_state (prelude). st_tat and st_r are the stored tat and
-- r.
local function decide(found, st_tat, st_r)
  -- x is how far tat lies beyond now, in 1/a ms; 0 once tat has passed.
  local x = 0
  if found then
    local ahead = st_tat - now
    if ahead >= 0 then
      -- A write never puts tat more than top beyond the now it was made at,
      -- so it lies further only if the clock went backwards or the limit
      -- changed. Capping there reads the key as owing its most, and
      -- checking before multiplying keeps ahead*a <= top.
      if ahead > math.floor(top / a) then
        x = top
      else
        x = math.min(top, ahead * a + math.min(st_r, a - 1))
      end
    end
  end

  -- allowed <=> x + c*b <= full, rearranged so no sum exceeds full.
  local room = (capacity - c) * b
  local allowed, retry_after, granted = 0, 0, 0
  local charged = false
  if x <= room then
    allowed = 1
    if cost > 0 then
      -- A lease takes up to want of the emissions the tolerance has room for.
      granted = math.max(cost, math.min(want, math.floor((full - x) / b)))
      x = x + granted * b
    end
  elseif charge and cost > 0 then
    -- x, cost*b <= 2^52 each: the sum is exact.
    charged = true
    x = math.min(x + cost * b, top)
  end
  local reset_after = ceildiv(x, a)
  if allowed == 0 and c > capacity then
    -- A charge that can never fit: when the quota is whole again.
    retry_after = reset_after
  elseif allowed == 0 then
    retry_after = ceildiv(x - room, a)
  end

  local reply = {allowed, capacity, math.floor(math.max(0, full - x) / b), reset_after,
    retry_after, granted, 0, 0}
  -- Denied checks that are not charges, and cost-0 checks, write nothing.
  if granted > 0 or charged then
    -- now + whole <= now + 2^52, still far below 2^53.
    local whole = math.floor(x / a)
    return reply, encode(now + whole, x - whole * a), math.max(reset_after, 1)
  end
  return reply
end

return check_state(key, 2, decide, 1)
