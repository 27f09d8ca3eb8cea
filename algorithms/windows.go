package algorithms

import "strconv"

// This file holds what the window algorithms (the fixed window and the
// sliding window counter) share: a count per window, in the model and in
// Redis, where each window is a key of its own.

// windowCounts are the counts of a key's windows, each named by its
// period and its start, as its Redis key is (WindowKey).
type windowCounts []windowCount

// windowCount is the count of the window of period p that starts at w.
type windowCount struct {
	p, w, used int64
}

// forget drops the windows whose keys have expired at nowMs: a window's
// key lives lives periods from its start (1: the fixed window; 2: the
// sliding counter, whose window counts as the previous one in the next).
func (c *windowCounts) forget(nowMs, lives int64) {
	kept := (*c)[:0]
	for _, wc := range *c {
		if wc.w+lives*wc.p > nowMs {
			kept = append(kept, wc)
		}
	}
	clear((*c)[len(kept):])
	*c = kept
}

// get returns the count of the window of period p that starts at w, 0 if
// there is none.
func (c windowCounts) get(p, w int64) int64 {
	for _, wc := range c {
		if wc.p == p && wc.w == w {
			return wc.used
		}
	}
	return 0
}

// set records used as the count of the window of period p starting at w.
func (c *windowCounts) set(p, w, used int64) {
	for i := range *c {
		if (*c)[i].p == p && (*c)[i].w == w {
			(*c)[i].used = used
			return
		}
	}
	*c = append(*c, windowCount{p: p, w: w, used: used})
}

// WindowKey is the Redis key of the window of period periodMs starting at
// startMs, for a window algorithm whose key prefix is prefix
// (Keys(a, base)[0], in the limit's hash tag, so every window is in its
// slot): "prefix:period:start".
func WindowKey(prefix string, periodMs, startMs int64) string {
	b := make([]byte, 0, len(prefix)+32)
	b = append(b, prefix...)
	b = append(b, ':')
	b = strconv.AppendInt(b, periodMs, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, startMs, 10)
	return string(b)
}

// ScriptKeys returns the KEYS of a check script call of limit l stored
// under base, made at about nowMs on Redis's clock: Keys, except for the
// window algorithms, whose state is one key per window: the key of the
// window of nowMs. Redis Cluster routes a script by the keys it names (while a
// slot moves, to where they are), so a fixed window's check names the
// window it will most likely count in; near an edge the script counts in
// the window of its own clock, the one beside it, in the same slot.
func ScriptKeys(l Limit, base string, nowMs int64) []string {
	keys := Keys(l.Algorithm, base)
	if HasWindowKeys(l.Algorithm) {
		p := l.PeriodMillis()
		keys[0] = WindowKey(keys[0], p, nowMs-nowMs%p)
	}
	return keys
}

// ReleaseKeys returns the KEYS of a release script call giving back units
// of grant g of limit l stored under base: Keys, except for the window
// algorithms: the key of the grant's window, the only one it can go back
// to.
func ReleaseKeys(l Limit, base string, g Grant) []string {
	keys := Keys(l.Algorithm, base)
	if HasWindowKeys(l.Algorithm) {
		keys[0] = WindowKey(keys[0], l.PeriodMillis(), g.Ref)
	}
	return keys
}

// HasWindowKeys reports whether algorithm a keeps one key per window
// (WindowKey): the fixed window and the sliding window counter.
func HasWindowKeys(a Algorithm) bool {
	return a == FixedWindow || a == SlidingWindowCounter
}
