package algorithms

import (
	"embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// ErrBadReply means a script's reply did not have the documented shape.
var ErrBadReply = errors.New("malformed script reply")

// scriptFile, releaseFile and keySuffixes describe each algorithm's Lua
// scripts and the Redis keys they use. Suffixes differ between algorithms so that a policy
// whose algorithm changes never reads another algorithm's state, and they
// change with the state's format (the 3 in ":tb3") so that two quotad
// versions on one Redis, as in a rolling upgrade, never read each other's
// state: each keeps its own (see legacySuffixes).
var (
	scriptFile = map[Algorithm]string{
		FixedWindow:          "scripts/fixed_window.lua",
		SlidingWindowLog:     "scripts/sliding_window_log.lua",
		SlidingWindowCounter: "scripts/sliding_window_counter.lua",
		TokenBucket:          "scripts/token_bucket.lua",
		LeakyBucket:          "scripts/leaky_bucket.lua",
		GCRA:                 "scripts/gcra.lua",
	}
	releaseFile = map[Algorithm]string{
		FixedWindow:          "scripts/release_fixed_window.lua",
		SlidingWindowLog:     "scripts/release_sliding_window_log.lua",
		SlidingWindowCounter: "scripts/release_sliding_window_counter.lua",
		TokenBucket:          "scripts/release_token_bucket.lua",
		LeakyBucket:          "scripts/release_leaky_bucket.lua",
		GCRA:                 "scripts/release_gcra.lua",
	}
	keySuffixes = map[Algorithm][]string{
		FixedWindow:          {":fw4"},
		SlidingWindowLog:     {":sl3", ":slm3"},
		SlidingWindowCounter: {":sc4"},
		TokenBucket:          {":tb3"},
		LeakyBucket:          {":lb3"},
		GCRA:                 {":gc3"},
		Concurrency:          {":cc"},
	}
	// legacySuffixes are the keys of earlier state formats (the HASH
	// states quotad kept before its STRING ones; each algorithm's STRING
	// state before its fresh form, which an older script would refuse as
	// malformed): no script reads them, but a
	// reset deletes them too, so that an older node still running beside
	// this one in a rolling upgrade sees the reset as well.
	legacySuffixes = []string{":fw", ":sl", ":slm", ":sc", ":tb", ":lb", ":gc", ":tb2", ":lb2", ":gc2", ":fw2", ":sc2", ":sl2", ":slm2", ":fw3", ":sc3"}
)

// CheckScript returns the Lua source of algorithm a's check script, which
// is also its acquire script. It returns "" for an invalid algorithm.
//
// Every check script takes the keys from Keys and the arguments from
// AcquireArgs (CheckArgs for a plain check), and replies with the eight
// integers DecodeAcquireReply reads.
func CheckScript(a Algorithm) string { return embedded(scriptFile, a) }

// ReleaseScript returns the Lua source of algorithm a's release script. It
// returns "" for an invalid algorithm.
//
// Every release script takes the same keys as the check script (Keys) and
// the arguments from ReleaseArgs, and replies with the one integer
// DecodeReleaseReply reads. It never creates a key and sets no TTL.
func ReleaseScript(a Algorithm) string { return embedded(releaseFile, a) }

// embedded returns the source of algorithm a's script in files, or "":
// scripts/prelude.lua (the clock and integer helpers every script shares;
// Redis scripts cannot import) followed by the script itself.
func embedded(files map[Algorithm]string, a Algorithm) string {
	name, ok := files[a]
	if !ok {
		return ""
	}
	prelude, err := scriptFiles.ReadFile("scripts/prelude.lua")
	if err != nil {
		// The files are embedded at build time; a missing one is a build bug
		// that the package tests catch.
		return ""
	}
	src, err := scriptFiles.ReadFile(name)
	if err != nil {
		return ""
	}
	return string(prelude) + string(src)
}

// Keys returns the Redis keys algorithm a uses for the limit whose key base
// is base. base must carry a Redis Cluster hash tag ("{...}") so that all of
// them land in one slot.
func Keys(a Algorithm, base string) []string {
	suffixes := keySuffixes[a]
	keys := make([]string, len(suffixes))
	for i, s := range suffixes {
		keys[i] = base + s
	}
	return keys
}

// AllKeys returns every Redis key any algorithm may use under base, in
// this state format or an earlier one: what a reset deletes.
func AllKeys(base string) []string {
	var keys []string
	for _, a := range append(Algorithms(), Concurrency) {
		keys = append(keys, Keys(a, base)...)
	}
	for _, s := range legacySuffixes {
		keys = append(keys, base+s)
	}
	return keys
}

// AcquireArgs returns the ARGV of a check script that may take more than
// cost for a lease: limit, period in ms, capacity, cost, the reduced rate a
// and b (see Limit.Rate), now in ms, want and hold in whole ms (rounded
// down), and 0 (see ChargeArgs). nowMs 0 makes the script read Redis TIME;
// only tests pass another value. want ≥ cost is the units the caller would
// like; hold is how long it may keep them (only the sliding window log uses
// it; a script reads it clamped to [0, MaxPeriod]).
func AcquireArgs(l Limit, cost, want int64, hold time.Duration, nowMs int64) []any {
	a, b := l.Rate()
	return []any{l.Limit, l.PeriodMillis(), l.Capacity(), cost, a, b, nowArg(nowMs), want, hold.Milliseconds(), 0}
}

// ChargeArgs returns the ARGV of a charge of cost: a check that counts its
// cost even when it does not fit (State.Charge), as AcquireArgs(l, cost,
// want, hold, nowMs) with the charge flag, the tenth argument, set. A
// charge that fits may take a lease as an acquire does.
func ChargeArgs(l Limit, cost, want int64, hold time.Duration, nowMs int64) []any {
	args := AcquireArgs(l, cost, want, hold, nowMs)
	args[len(args)-1] = 1
	return args
}

// CheckArgs returns the ARGV of a plain check of cost: AcquireArgs(l, cost,
// cost, 0, nowMs).
func CheckArgs(l Limit, cost, nowMs int64) []any {
	return AcquireArgs(l, cost, cost, 0, nowMs)
}

// ReleaseArgs returns the ARGV of a release script giving back units of
// grant g: limit, period in ms, capacity, units, a, b, now in ms (nowMs 0:
// Redis TIME), g.Ref and g.Units.
func ReleaseArgs(l Limit, units int64, g Grant, nowMs int64) []any {
	a, b := l.Rate()
	return []any{l.Limit, l.PeriodMillis(), l.Capacity(), units, a, b, nowArg(nowMs), g.Ref, g.Units}
}

// nowArg is the now argument of a script: "" (read Redis TIME) for 0.
func nowArg(nowMs int64) string {
	if nowMs == 0 {
		return ""
	}
	return fmt.Sprint(nowMs)
}

// DecodeCheckReply converts a check script's reply into a Decision,
// dropping the grant: DecodeAcquireReply's Decision.
func DecodeCheckReply(reply any) (Decision, error) {
	d, _, err := DecodeAcquireReply(reply)
	return d, err
}

// DecodeAcquireReply converts a check script's reply, {allowed (0|1),
// limit, remaining, reset_after_ms, retry_after_ms, granted, use_within_ms,
// ref}, into a Decision and a Grant. A reply of another shape, or whose
// values break the contract (a denial that granted units, a grant larger
// than the limit), is an error wrapping ErrBadReply.
func DecodeAcquireReply(reply any) (Decision, Grant, error) {
	n, err := replyInts(reply, 8)
	if err != nil {
		return Decision{}, Grant{}, err
	}
	allowed, limit, remaining, resetMs, retryMs := n[0], n[1], n[2], n[3], n[4]
	granted, useMs, ref := n[5], n[6], n[7]
	switch {
	case allowed != 0 && allowed != 1:
		return Decision{}, Grant{}, fmt.Errorf("%w: allowed is %d", ErrBadReply, allowed)
	case limit <= 0 || remaining < 0 || remaining > limit:
		return Decision{}, Grant{}, fmt.Errorf("%w: remaining %d outside [0, limit %d]", ErrBadReply, remaining, limit)
	case resetMs < 0 || retryMs < 0 || (allowed == 1 && retryMs != 0):
		return Decision{}, Grant{}, fmt.Errorf("%w: reset_after %d ms, retry_after %d ms", ErrBadReply, resetMs, retryMs)
	case granted < 0 || granted > limit || (allowed == 0 && granted != 0):
		return Decision{}, Grant{}, fmt.Errorf("%w: granted %d (allowed %d, limit %d)", ErrBadReply, granted, allowed, limit)
	case useMs < 0:
		return Decision{}, Grant{}, fmt.Errorf("%w: use_within %d ms", ErrBadReply, useMs)
	}
	d := Decision{
		Allowed:    allowed == 1,
		Limit:      limit,
		Remaining:  remaining,
		ResetAfter: waitDuration(resetMs),
		RetryAfter: waitDuration(retryMs),
	}
	return d, Grant{Units: granted, UseWithin: waitDuration(useMs), Ref: ref}, nil
}

// DecodeReleaseReply reads a release script's reply, {returned}: how many
// of the units given back made a difference, ≥ 0.
func DecodeReleaseReply(reply any) (returned int64, err error) {
	n, err := replyInts(reply, 1)
	if err != nil {
		return 0, err
	}
	if n[0] < 0 {
		return 0, fmt.Errorf("%w: returned %d", ErrBadReply, n[0])
	}
	return n[0], nil
}

// replyInts reads a script's reply that must be an array of want integers.
func replyInts(reply any, want int) ([]int64, error) {
	items, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: got %T, want an array", ErrBadReply, reply)
	}
	if len(items) != want {
		return nil, fmt.Errorf("%w: got %d items, want %d", ErrBadReply, len(items), want)
	}
	n := make([]int64, want)
	for i, it := range items {
		v, ok := it.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: item %d is %T, want an integer", ErrBadReply, i, it)
		}
		n[i] = v
	}
	return n, nil
}

// argsPerCheck is the length of AcquireArgs: the ARGV of one check.
const argsPerCheck = 10

// MaxBatchChecks bounds the checks one batch script call decides, so that
// one call blocks Redis for well under a millisecond.
const MaxBatchChecks = 64

// MaxBatchKeyBytes bounds the bytes of the keys one batch script call
// carries, beside MaxBatchChecks: a check's Redis work grows with its key
// (the script builds its state key from it and Redis stores it), and a
// flood of 1 KiB keys (CheckBatch, 64 at a time) made each call hold Redis
// for about a millisecond, for every node on it. Typical keys (tens of
// bytes) never reach it; a call whose keys alone exceed it goes by itself.
const MaxBatchKeyBytes = 8 << 10

// batchDriver runs a check script's exact source (at CHECK_SCRIPT) once
// per check of a batch, in order. KEYS are the checks' keys, NKEYS per
// check; ARGV their arguments, argsPerCheck per check. Each check is
// protected on its own: a check that raises an error (a key of the wrong
// type) puts that error in its place of the reply, and the others are
// still decided.
const batchDriver = `
local function check(KEYS, ARGV)
CHECK_SCRIPT
end

local nk, na = NKEYS, NARGS
-- One keys and one argv table for all the checks: a check script only
-- reads them. Arguments reach it as numbers where they are ones (it reads
-- each with tonumber, which returns a number as it is), each distinct one
-- parsed once per call: the checks of a batch mostly share their limit.
local out, keys, argv, parsed = {}, {}, {}, {}
for i = 0, #ARGV / na - 1 do
  for j = 1, nk do keys[j] = KEYS[i * nk + j] end
  for j = 1, na do
    local s = ARGV[i * na + j]
    local v = parsed[s]
    if v == nil then
      v = tonumber(s) or s
      parsed[s] = v
    end
    argv[j] = v
  end
  local ok, reply = pcall(check, keys, argv)
  if not ok and not (type(reply) == 'table' and reply.err) then
    reply = redis.error_reply(tostring(reply))
  end
  out[i + 1] = reply
end
return out
`

// BatchCheckScript returns the Lua source of algorithm a's batch check
// script, or "" for an invalid algorithm. One call decides several checks,
// in order, each exactly as one call of CheckScript(a) would, except that
// Redis TIME is read once for all of them: so Redis pays once for the
// script call and the clock, not once per check.
//
// Its keys are the checks' Keys one after another (every check's keys
// must be in one Redis Cluster slot for the call to run there); its
// arguments are the checks' AcquireArgs one after another. SplitBatchReply reads its reply. A check that fails (a
// key of the wrong type) fails alone.
func BatchCheckScript(a Algorithm) string {
	src := embedded(scriptFile, a)
	if src == "" {
		return ""
	}
	prelude, body, ok := splitPrelude(src)
	if !ok {
		return ""
	}
	driver := strings.NewReplacer("NKEYS", strconv.Itoa(len(keySuffixes[a])), "NARGS", strconv.Itoa(argsPerCheck)).Replace(batchDriver)
	return prelude + strings.Replace(driver, "CHECK_SCRIPT", body, 1)
}

// splitPrelude splits an embedded script into the prelude, which must stay
// at the chunk's top level, and the script's own body.
func splitPrelude(src string) (prelude, body string, ok bool) {
	p, err := scriptFiles.ReadFile("scripts/prelude.lua")
	if err != nil || !strings.HasPrefix(src, string(p)) {
		return "", "", false
	}
	return string(p), src[len(p):], true
}

// SplitBatchReply splits the reply of a batch script call that decided n
// checks into each check's own reply, in order: what DecodeAcquireReply
// reads, or, for a check that failed, the error Redis reported for it (an
// error value). A reply of another shape is an error wrapping ErrBadReply.
func SplitBatchReply(reply any, n int) ([]any, error) {
	items, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: batch reply is %T, want an array", ErrBadReply, reply)
	}
	if len(items) != n {
		return nil, fmt.Errorf("%w: batch reply has %d items, want %d", ErrBadReply, len(items), n)
	}
	return items, nil
}
