-- Reserve: a check of an estimated cost that, when admitted, records the
-- reservation so that Settle can later refund what was not used or charge
-- what was used beyond it, exactly once. The rules, shared with the Go
-- model (algorithms.Reservation), are docs/algorithms.md, "Reservations".
--
-- Composed after the prelude and the algorithm's acquire body (acquire_body,
-- which reads keys and args), see algorithms.ReserveScript.
--
-- KEYS     the algorithm's keys (Keys), then the reservation's record
--          (ReservationKey): STRING "r estimate ref granted", with a TTL of
--          the reservation's lifetime
-- ARGV     the acquire layout (ReserveArgs: cost = the estimate, want = cost,
--          no hold, no charge), then the lifetime in ms
-- Reply    the acquire reply; an error if the record exists already

local record = KEYS[#KEYS]
keys = {}
for i = 1, #KEYS - 1 do keys[i] = KEYS[i] end
args = {}
for i = 1, #ARGV - 1 do args[i] = ARGV[i] end
local lifetime = tonumber(ARGV[#ARGV])

if redis.call('EXISTS', record) == 1 then
  return redis.error_reply('reservation id in use')
end
local r = acquire_body()
-- Only an admitted positive cost is held: a denial or a cost of 0 leaves
-- nothing to settle.
if r[1] == 1 and r[6] > 0 then
  redis.call('SET', record, 'r ' .. int(tonumber(args[4])) .. ' ' .. int(r[8]) .. ' ' .. int(r[6]), 'PX', lifetime)
end
return r
