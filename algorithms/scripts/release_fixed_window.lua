-- Fixed window release: gives back unused units of a lease grant to the
-- window they were taken in, while it is the current one. The rules, shared
-- with the Go model (FixedWindowState.Release), are docs/algorithms.md,
-- "Leases".
--
-- KEYS[1]  base:fw3  STRING "w n": w = window start ms, n = units spent in
--          window w (prelude: load, save; or its fresh form, parse)
-- ARGV     limit, period_ms, capacity, units, a, b, now_ms ("" = Redis TIME),
--          ref (the grant's window start), granted
-- Reply    {returned}
--
-- Never creates the key and sets no TTL: SET KEEPTTL keeps the one the check set.

local key = KEYS[1]
local period = tonumber(ARGV[2])
-- Never more than the grant took, nor than any grant can hold.
local units = math.min(tonumber(ARGV[4]), tonumber(ARGV[9]), tonumber(ARGV[3]))
local now = now_ms(ARGV[7])
local ref = tonumber(ARGV[8])

if units <= 0 then return {0} end
local found, raw_w, used = load(key, 2, 1)
-- A missing key is an empty window already.
if not found then return {0} end
-- The current window as the check computes it.
local stored_w = raw_w - raw_w % period
local w = math.max(now - now % period, stored_w)
-- Once the grant's window has ended its units are gone with it.
if w ~= ref or w ~= stored_w then return {0} end
local returned = math.min(units, used)
if returned <= 0 then return {0} end
save(key, raw_w, used - returned)
return {returned}
