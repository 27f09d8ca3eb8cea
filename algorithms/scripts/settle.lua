-- Settle: ends a reservation with the cost actually used, once. Below the
-- estimate, the difference is given back as a lease's unused units are
-- (release_body: only while it still counts, e.g. in the same fixed
-- window); above it, the difference is charged and always counts, into
-- debt if need be (acquire_body with the charge flag). Then a check of cost
-- 0 reports the key as it stands. The rules, shared with the Go model
-- (algorithms.Reservation), are docs/algorithms.md, "Reservations".
--
-- Composed after the prelude, acquire_body and release_body (which read
-- keys and args), see algorithms.SettleScript.
--
-- KEYS     the algorithm's keys (Keys), then the reservation's record
--          (ReservationKey)
-- ARGV     limit, period_ms, capacity, actual, a, b, now_ms ("" = Redis TIME)
-- Reply    {outcome (0: no such reservation, or expired; 1: settled now;
--          2: settled before), actual recorded (outcome 1 and 2), refunded,
--          charged, allowed, limit, remaining, reset_after_ms,
--          retry_after_ms}: the last five for a check of cost 0 after the
--          settlement

local record = KEYS[#KEYS]
keys = {}
for i = 1, #KEYS - 1 do keys[i] = KEYS[i] end
local actual = tonumber(ARGV[4])

-- after reports the key as it stands: a check of cost 0 writes nothing.
local function after(outcome, recorded, refunded, charged)
  args = {ARGV[1], ARGV[2], ARGV[3], 0, ARGV[5], ARGV[6], ARGV[7], 0, 0, 0}
  local r = acquire_body()
  return {outcome, recorded, refunded, charged, r[1], r[2], r[3], r[4], r[5]}
end

local raw = redis.call('GET', record)
if not raw then return after(0, 0, 0, 0) end
local settled = string.match(raw, '^s (%d+)$')
if settled then return after(2, tonumber(settled), 0, 0) end
local estimate, ref, granted = string.match(raw, '^r (%d+) (%-?%d+) (%d+)$')
if not estimate then
  return redis.error_reply('malformed reservation record')
end
estimate, ref, granted = tonumber(estimate), tonumber(ref), tonumber(granted)

-- Marked first and kept as long as the reservation would have lived, so
-- that a retried settle finds it settled.
redis.call('SET', record, 's ' .. int(actual), 'KEEPTTL')
local refunded, charged = 0, 0
if actual < estimate then
  args = {ARGV[1], ARGV[2], ARGV[3], estimate - actual, ARGV[5], ARGV[6], ARGV[7], ref, granted}
  refunded = release_body()[1]
elseif actual > estimate then
  local extra = actual - estimate
  args = {ARGV[1], ARGV[2], ARGV[3], extra, ARGV[5], ARGV[6], ARGV[7], extra, 0, 1}
  acquire_body()
  charged = extra
end
return after(1, actual, refunded, charged)
