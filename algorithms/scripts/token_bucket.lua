-- Token bucket: a bucket of `capacity` tokens refilled at a/b (a units every
-- b ms); an admitted request takes its cost. The rules, and the Go model this
-- must match decision for decision, are docs/algorithms.md "Token bucket" and
-- algorithms/token_bucket.go.
--
-- KEYS[1]  base..":tb3", a STRING "t r ts" (prelude: parse, save): t = whole
--          tokens, r = the part of the next token refilled so far in 1/b
--          tokens (0 <= r < b), ts = time of the last refill in ms. A missing
--          key is a full bucket.
-- ARGV     limit, period_ms, capacity, cost, a, b, now_ms ("" reads TIME),
--          want (units a lease would like, >= cost; missing = cost), hold_ms
--          (unused: units taken early are only ever more conservative),
--          charge (1: a cost that does not fit takes its tokens all the same,
--          below empty; State.Charge)
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
-- Limit.MaxCharge: the deepest debt, which keeps (capacity - t)*b within 2^52.
local most = math.floor(MAX_EXACT / b)

-- decide: see check_state (prelude). st_t, st_r and st_ts are the stored t,
-- r and ts.
local function decide(found, st_t, st_r, st_ts)
  local tokens, r, last = capacity, 0, now
  if found then
    -- Read a state written under another limit clamped to this one, so
    -- remaining stays in [0, capacity] and products stay in bounds: a debt
    -- of at most most.
    tokens = math.max(math.min(st_t, capacity), capacity - most)
    r = math.min(st_r, b - 1)
    last = st_ts
  end

  -- Refill. Comparing e with the time to fill up before multiplying keeps
  -- e*a below capacity*b + a however long the key sat idle. A clock that went
  -- backwards refills nothing.
  local e = math.max(0, now - last)
  if e >= ceildiv((capacity - tokens) * b - r, a) then
    tokens, r = capacity, 0
  else
    local acc = r + e * a
    local whole = math.floor(acc / b)
    tokens, r = tokens + whole, acc - whole * b
  end
  last = math.max(last, now)

  local allowed, granted = 0, 0
  local charged = false
  if tokens >= c then
    allowed = 1
    if cost > 0 then
      -- A lease takes up to want of the tokens there are.
      granted = math.max(cost, math.min(want, tokens))
      tokens = tokens - granted
    end
  elseif charge and cost > 0 then
    charged = true
    tokens = math.max(tokens - cost, capacity - most)
  end
  local reset_after, retry_after = ceildiv((capacity - tokens) * b - r, a), 0
  if allowed == 0 and c > capacity then
    -- A charge that can never fit: when the quota is whole again.
    retry_after = reset_after
  elseif allowed == 0 then
    -- c - tokens <= most, so the product stays within 2^52.
    retry_after = ceildiv((c - tokens) * b - r, a)
  end

  local reply = {allowed, capacity, math.max(0, tokens), reset_after, retry_after, granted,
    0, 0}
  -- Denied checks that are not charges, and cost-0 checks, write nothing.
  if granted > 0 or charged then
    return reply, encode(tokens, r, last), math.max(reset_after, 1)
  end
  return reply
end

return check_state(key, 3, decide, 3)
