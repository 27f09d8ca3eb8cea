package algorithms

import (
	"fmt"
	"strconv"
)

// WindowIncrement is a check of a window algorithm (the fixed window, the
// sliding window counter) made with plain commands instead of the script,
// by a node that knows which window Redis's clock is in for the whole time
// the check may take (far from the window's edges):
//
//	GET PrevKey                      (sliding counter: the previous window)
//	INCRBY Key By                    (GET Key for a check of cost 0)
//	PEXPIREAT Key ExpireAtMs NX
//
// sent together (Commands). Each window's key holds the integer count the
// scripts read and write (scripts/fixed_window.lua,
// scripts/sliding_window_counter.lua), so INCRBY adds to what every node
// and script counts, and its reply, less By, is what was spent before.
// Outcome decides the check on those counts exactly as the script would
// have on the same counts; what the check took beyond its decision (all of
// By for a denial, the rest of a lease's want beyond its grant) must then
// be given back with GiveBack's commands. Until it is, the count is higher
// than what was spent, so other checks meanwhile are decided stricter,
// never looser: no window ever admits more than its limit.
//
// PEXPIREAT ... NX gives a key the INCRBY created its TTL (the window's
// end, or for the sliding counter the next window's) and leaves a key that
// has one as it is.
type WindowIncrement struct {
	l          Limit
	w          int64
	cost, want int64
	charge     bool
	// Key is the window's key; PrevKey the previous window's, for the
	// sliding counter ("" for the fixed window).
	Key, PrevKey string
	By           int64
	ExpireAtMs   int64
}

// NewWindowIncrement returns the plain commands of a check of cost (a
// lease would like want ≥ cost; a charge when charge) of window limit l,
// whose window keys have the prefix Keys(l.Algorithm, base)[0], in the
// window that starts at windowStartMs, and true; or false when the check
// must go to the script: l is not a window algorithm (HasWindowKeys), or
// the cost is above the capacity (a plain check of it is denied without
// writing; a charge of it is capped at MaxCharge, which INCRBY cannot do).
// l and cost must be valid and windowStartMs a multiple of l's period.
func NewWindowIncrement(l Limit, prefix string, windowStartMs, cost, want int64, charge bool) (WindowIncrement, bool) {
	if !HasWindowKeys(l.Algorithm) || cost < 0 || cost > l.Capacity() {
		return WindowIncrement{}, false
	}
	p := l.PeriodMillis()
	wi := WindowIncrement{l: l, w: windowStartMs, cost: cost, want: max(want, cost), charge: charge,
		Key: WindowKey(prefix, p, windowStartMs), ExpireAtMs: windowStartMs + p}
	if l.Algorithm == SlidingWindowCounter {
		wi.PrevKey = WindowKey(prefix, p, windowStartMs-p)
		wi.ExpireAtMs += p
	}
	if cost > 0 {
		wi.By = min(wi.want, l.Capacity())
	}
	return wi, true
}

// Commands are the check's commands, in order: GET PrevKey if readPrev
// (a sliding counter whose previous window's count the caller does not
// know already), then INCRBY (GET for By 0), then, if expire and By > 0,
// PEXPIREAT ... NX. Counts reads their replies.
func (wi WindowIncrement) Commands(readPrev, expire bool) [][]any {
	var cmds [][]any
	if readPrev && wi.PrevKey != "" {
		cmds = append(cmds, []any{"get", wi.PrevKey})
	}
	if wi.By == 0 {
		return append(cmds, []any{"get", wi.Key})
	}
	cmds = append(cmds, []any{"incrby", wi.Key, wi.By})
	if expire {
		cmds = append(cmds, wi.Expire())
	}
	return cmds
}

// Counts reads the replies of Commands(readPrev, ...), one per command (a
// nil reply, a missing key, as nil), into the window's count after the
// INCRBY (or as GET read it) and the previous window's (knownPrev when
// not readPrev; 0 for the fixed window).
func (wi WindowIncrement) Counts(replies []any, readPrev bool, knownPrev int64) (count, prev int64, err error) {
	prev = knownPrev
	if readPrev && wi.PrevKey != "" {
		if len(replies) == 0 {
			return 0, 0, fmt.Errorf("%w: no reply", ErrBadReply)
		}
		if prev, err = windowCountReply(wi.PrevKey, replies[0]); err != nil {
			return 0, 0, err
		}
		replies = replies[1:]
	}
	if len(replies) == 0 {
		return 0, 0, fmt.Errorf("%w: no reply", ErrBadReply)
	}
	count, err = windowCountReply(wi.Key, replies[0])
	return count, prev, err
}

// windowCountReply reads a window's count from INCRBY's reply or GET's.
func windowCountReply(key string, reply any) (int64, error) {
	switch v := reply.(type) {
	case int64:
		return v, nil
	case nil:
		return 0, nil
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed state in %s: %q", key, v)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: the count of %s is %T", ErrBadReply, key, reply)
}

// Expire is PEXPIREAT ... NX alone: for a node that sent the INCRBY alone,
// guessing the key had its TTL, and found by the reply (By: the count was
// 0) that the INCRBY created it.
func (wi WindowIncrement) Expire() []any {
	return []any{"pexpireat", wi.Key, wi.ExpireAtMs, "nx"}
}

// Outcome is the check's decision and grant at nowMs, a time in the
// window, given count, the window's count as Counts read it, and prev, the
// previous window's (sliding counter); and how many of the By units it
// took must go back (GiveBack).
func (wi WindowIncrement) Outcome(count, prev, nowMs int64) (d Decision, g Grant, giveBack int64) {
	before := count - wi.By
	var after int64
	if wi.l.Algorithm == SlidingWindowCounter {
		d, g, after = slidingCounterDecide(wi.l, wi.w, before, prev, nowMs, wi.cost, wi.want, wi.charge)
	} else {
		d, g, after = fixedWindowDecide(wi.l, wi.w, before, nowMs, wi.cost, wi.want, wi.charge)
	}
	kept := after - min(max(before, 0), wi.l.MaxCharge())
	return d, g, wi.By - kept
}

// GiveBack is the commands that give units back to the window:
// DECRBY and PEXPIREAT ... NX, so that a DECRBY that comes after the
// window's key expired leaves nothing behind (the key it creates has its
// end in the past, and goes at once).
func (wi WindowIncrement) GiveBack(units int64) (first, then []any) {
	return []any{"decrby", wi.Key, units}, wi.Expire()
}

// Window is the window's start and end, in ms since the Unix epoch.
func (wi WindowIncrement) Window() (startMs, endMs int64) { return wi.w, wi.w + wi.l.PeriodMillis() }
