package algorithms

import (
	"embed"
	"errors"
	"fmt"
)

//go:embed scripts/*.lua
var scriptFiles embed.FS

// ErrBadReply means a script's reply did not have the documented shape.
var ErrBadReply = errors.New("malformed script reply")

// scriptFile and keySuffixes describe each algorithm's Lua script and the
// Redis keys it uses. Suffixes differ between algorithms so that a policy
// whose algorithm changes never reads another algorithm's state.
var (
	scriptFile = map[Algorithm]string{
		FixedWindow:          "scripts/fixed_window.lua",
		SlidingWindowLog:     "scripts/sliding_window_log.lua",
		SlidingWindowCounter: "scripts/sliding_window_counter.lua",
		TokenBucket:          "scripts/token_bucket.lua",
		LeakyBucket:          "scripts/leaky_bucket.lua",
		GCRA:                 "scripts/gcra.lua",
	}
	keySuffixes = map[Algorithm][]string{
		FixedWindow:          {":fw"},
		SlidingWindowLog:     {":sl", ":slm"},
		SlidingWindowCounter: {":sc"},
		TokenBucket:          {":tb"},
		LeakyBucket:          {":lb"},
		GCRA:                 {":gc"},
	}
)

// CheckScript returns the Lua source of algorithm a's check script. It
// returns "" for an invalid algorithm.
//
// Every check script takes the keys from Keys and the arguments from
// CheckArgs, and replies with the five integers DecodeCheckReply reads.
func CheckScript(a Algorithm) string {
	name, ok := scriptFile[a]
	if !ok {
		return ""
	}
	src, err := scriptFiles.ReadFile(name)
	if err != nil {
		// The files are embedded at build time; a missing one is a build bug
		// that the package tests catch.
		return ""
	}
	return string(src)
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

// AllKeys returns every Redis key any algorithm may use under base: what a
// reset deletes.
func AllKeys(base string) []string {
	var keys []string
	for _, a := range Algorithms() {
		keys = append(keys, Keys(a, base)...)
	}
	return keys
}

// CheckArgs returns the ARGV of a check script: limit, period in ms,
// capacity, cost, the reduced rate a and b (see Limit.Rate), and now in ms.
// nowMs 0 makes the script read Redis TIME; only tests pass another value.
func CheckArgs(l Limit, cost, nowMs int64) []any {
	a, b := l.Rate()
	now := ""
	if nowMs != 0 {
		now = fmt.Sprint(nowMs)
	}
	return []any{l.Limit, l.PeriodMillis(), l.Capacity(), cost, a, b, now}
}

// DecodeCheckReply converts a check script's reply, {allowed (0|1), limit,
// remaining, reset_after_ms, retry_after_ms}, into a Decision.
func DecodeCheckReply(reply any) (Decision, error) {
	items, ok := reply.([]any)
	if !ok {
		return Decision{}, fmt.Errorf("%w: got %T, want an array", ErrBadReply, reply)
	}
	if len(items) != 5 {
		return Decision{}, fmt.Errorf("%w: got %d items, want 5", ErrBadReply, len(items))
	}
	var n [5]int64
	for i, it := range items {
		v, ok := it.(int64)
		if !ok {
			return Decision{}, fmt.Errorf("%w: item %d is %T, want an integer", ErrBadReply, i, it)
		}
		n[i] = v
	}
	allowed, limit, remaining, resetMs, retryMs := n[0], n[1], n[2], n[3], n[4]
	switch {
	case allowed != 0 && allowed != 1:
		return Decision{}, fmt.Errorf("%w: allowed is %d", ErrBadReply, allowed)
	case limit <= 0 || remaining < 0 || remaining > limit:
		return Decision{}, fmt.Errorf("%w: remaining %d outside [0, limit %d]", ErrBadReply, remaining, limit)
	case resetMs < 0 || retryMs < 0 || (allowed == 1 && retryMs != 0):
		return Decision{}, fmt.Errorf("%w: reset_after %d ms, retry_after %d ms", ErrBadReply, resetMs, retryMs)
	}
	return Decision{
		Allowed:    allowed == 1,
		Limit:      limit,
		Remaining:  remaining,
		ResetAfter: waitDuration(resetMs),
		RetryAfter: waitDuration(retryMs),
	}, nil
}
