-- Leaky bucket, meter form: each admitted unit raises the level by one, the
-- level drains at a/b (a units every b ms), and a cost is admitted only if
-- the level stays within `capacity`. The rules, and the Go model this must
-- match decision for decision, are docs/algorithms.md "Leaky bucket" and
-- algorithms/leaky_bucket.go.
--
-- KEYS[1]  base..":lb3", a STRING "l d ts" (prelude: parse, save): l = level
--          rounded up, d = how much of the top unit has drained in 1/b units
--          (0 <= d < b; the exact level is l - d/b), ts = time of the last
--          drain in ms. A missing key is an empty bucket.
-- ARGV     limit, period_ms, capacity, cost, a, b, now_ms ("" reads TIME),
--          want (units a lease would like, >= cost; missing = cost), hold_ms
--          (unused: units taken early are only ever more conservative),
--          charge (1: a cost that does not fit is poured in all the same, above
--          the capacity; State.Charge)
-- Reply    {allowed (0|1), capacity, remaining, reset_after_ms, retry_after_ms,
--          granted, use_within_ms (0: no bound), ref (0)}; see
--          docs/algorithms.md, "Leases"
--
-- Integers only: Limit.Validate bounds capacity*b and a by 2^52, so no value
-- here exceeds capacity*b + a <= 2^53 and Lua numbers (doubles) hold every
-- one exactly.

local key = KEYS[1]
local capacity = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local a = tonumber(ARGV[5])
local b = tonumber(ARGV[6])
local now = now_ms(ARGV[7])

local want = tonumber(ARGV[8]) or cost
local charge = tonumber(ARGV[10]) == 1
local c = math.max(cost, 1)
-- Limit.MaxCharge: the highest level, which keeps level*b within 2^52.
local most = math.floor(MAX_EXACT / b)

-- decide: see check_state (prelude). st_l, st_d and st_ts are the stored l,
-- d and ts.
local function decide(found, st_l, st_d, st_ts)
  local level, d, last = 0, 0, now
  if found then
    -- A level above the capacity is a charge's debt, or was poured under a
    -- larger limit; it counts in full, up to most, which keeps products in
    -- bounds.
    level = math.min(st_l, most)
    d = math.min(st_d, b - 1)
    last = st_ts
  end

  -- Drain. Comparing e with the time to empty before multiplying keeps e*a
  -- below capacity*b + a however long the key sat idle. A clock that went
  -- backwards drains nothing.
  local e = math.max(0, now - last)
  if e >= ceildiv(level * b - d, a) then
    level, d = 0, 0
  else
    local acc = d + e * a
    local whole = math.floor(acc / b)
    level, d = level - whole, acc - whole * b
  end
  last = math.max(last, now)

  local allowed, granted = 0, 0
  local charged = false
  if level + c <= capacity then
    allowed = 1
    if cost > 0 then
      -- A lease takes up to want of the room there is.
      granted = math.max(cost, math.min(want, capacity - level))
      level = level + granted
    end
  elseif charge and cost > 0 then
    charged = true
    level = math.min(level + cost, most)
  end
  local reset_after, retry_after = ceildiv(level * b - d, a), 0
  if allowed == 0 and c > capacity then
    -- A charge that can never fit: when the quota is whole again.
    retry_after = reset_after
  elseif allowed == 0 then
    -- The time for the exact level to drop to capacity - c.
    retry_after = ceildiv((level + c - capacity) * b - d, a)
  end

  local reply = {allowed, capacity, math.max(0, capacity - level), reset_after, retry_after,
    granted, 0, 0}
  -- Denied checks that are not charges, and cost-0 checks, write nothing.
  if granted > 0 or charged then
    return reply, encode(level, d, last), math.max(reset_after, 1)
  end
  return reply
end

return check_state(key, 3, decide, 3)
