package redis

import (
	"context"
	"errors"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// This file is the window algorithms' check without a script: plain
// INCRBY on the window's own key, for a node that knows Redis's clock is
// in that window for as long as the check may take (clock.go).

// acquireWindow makes r, a check of a window algorithm's limit (the fixed
// window, the sliding window counter), with plain commands
// (algorithms.WindowIncrement; without PEXPIREAT for a window this node
// remembers counting, key_memory.go) when Redis's clock is sure to stay in
// one window from now until the check's deadline, by the node's estimate
// (redisClock.bounds). handled is false, and nothing was sent, when it is
// not: the check must go to the script, which reads the clock itself. A
// reply that comes before the deadline was written while Redis's clock was
// in that window, so the check counts in the window the script would have
// counted it in; a reply that comes after the caller left has what it took
// given back (what a charge recorded beyond a grant stays, as the script's
// late replies leave it).
//
// The sliding counter weighs the previous window by the time: the check
// is decided at the earliest time Redis's clock may read now, when that
// weight is the largest, so the decision errs strict; a lease's life is
// counted to its window's end from the latest.
func (s *Store) acquireWindow(ctx context.Context, pipe *pipeline, r node.AcquireRequest, prefix string, timeout time.Duration, span trace.Span) (d algorithms.Decision, g algorithms.Grant, handled bool, err error) {
	l := r.Limit
	start := time.Now()
	nowLo, nowHi, ok := s.clock.bounds(0)
	if !ok {
		return d, g, false, nil
	}
	// The deadline is set a little after now (pipeline.run); a millisecond
	// covers it.
	lo, hi, ok := s.clock.bounds(timeout + time.Millisecond)
	p := l.PeriodMillis()
	w := lo - lo%p
	if !ok || lo < 0 || hi >= w+p {
		return d, g, false, nil
	}
	wi, ok := algorithms.NewWindowIncrement(l, prefix, w, r.Cost, r.Want, r.Charge)
	if !ok {
		return d, g, false, nil
	}
	nowMs := min(max(nowHi, w), w+p-1)
	if l.Algorithm == algorithms.SlidingWindowCounter {
		nowMs = min(max(nowLo, w), w+p-1)
	}
	leaseEnd := time.Duration(w+p-nowHi) * time.Millisecond
	// A window this node saw counting has its TTL already: its INCRBY
	// goes without PEXPIREAT. (A wrong guess is caught by the reply: see
	// below.)
	known := s.known.holds(wi.Key, start)
	// A sliding counter's previous window this node read as empty stays
	// empty: it ended before the read, and nothing counts in a window
	// after its end.
	prevEmpty := wi.PrevKey != "" && s.known.holds(emptyWindow(wi.PrevKey), start)
	cmds := wi.Commands(!prevEmpty, !known)
	// outcome reads reply: the decision and grant, the units to give back,
	// and the counts of the window and of the previous one.
	outcome := func(reply any) (d algorithms.Decision, g algorithms.Grant, giveBack, count, prev int64, err error) {
		replies, ok := reply.([]any)
		if !ok {
			replies = []any{reply}
		}
		if count, prev, err = wi.Counts(replies, !prevEmpty, 0); err != nil {
			return d, g, 0, 0, 0, err
		}
		d, g, giveBack = wi.Outcome(count, prev, nowMs)
		if g.Units > 0 {
			g.UseWithin = min(g.UseWithin, leaseEnd)
		}
		return d, g, giveBack, count, prev, nil
	}
	var lateReply func(any)
	if wi.By > 0 {
		lateReply = func(reply any) {
			// The caller never had the grant: it goes back too.
			if _, g, giveBack, _, _, err := outcome(reply); err == nil && giveBack+g.Units > 0 {
				s.giveBackWindow(wi, giveBack+g.Units)
			}
		}
	}
	var reply any
	if len(cmds) == 1 {
		// GET of a missing key: a count of 0.
		if reply, err = pipe.runPlain(ctx, timeout, lateReply, wi.Key, cmds[0]...); errors.Is(err, goredis.Nil) {
			reply, err = nil, nil
		}
	} else {
		reply, err = pipe.runPlainThen(ctx, timeout, lateReply, wi.Key, cmds[0], cmds[1:]...)
	}
	if err != nil {
		return d, g, true, err
	}
	d, g, giveBack, count, prev, err := outcome(reply)
	if err != nil {
		return d, g, true, err
	}
	if wi.By > 0 {
		if known && count == wi.By {
			// The key was guessed wrong (the window was new, or the key
			// expired or was reset since): the INCRBY created it, with
			// no TTL. Give it one now.
			_, _ = s.releasePipe.runPlain(context.Background(), s.cfg.netTimeout(), nil, wi.Key, wi.Expire()...)
		}
		s.known.note(wi.Key, start, wi.ExpireAtMs-nowMs)
	}
	if wi.PrevKey != "" && !prevEmpty && prev <= 0 {
		_, end := wi.Window()
		s.known.note(emptyWindow(wi.PrevKey), start, end-nowMs)
	}
	if giveBack > 0 && !r.Charge {
		// The count was over the limit: this check's own INCRBY, or
		// another's on its way back. Taken back whole, the check goes to
		// the script, which decides on the count as it stands: a client
		// that checks again after a denial finds what the denial left.
		s.giveBackWindow(wi, wi.By)
		return d, g, false, nil
	}
	if giveBack > 0 {
		// A charge counts what it recorded; only what it took beyond
		// that goes back.
		s.giveBackWindow(wi, giveBack)
	}
	op := windowOperation
	if wi.By == 0 {
		op = "GET"
	}
	markPlain(span, op)
	return d, g, true, nil
}

// giveBackWindow takes units back out of wi's window (DECRBY), on the
// release pipeline, and waits for it at most the network timeout. Until
// it is done the window counts them, which only makes other checks
// stricter; a give-back that fails leaves them counted until the window
// ends.
func (s *Store) giveBackWindow(wi algorithms.WindowIncrement, units int64) {
	first, then := wi.GiveBack(units)
	_, _ = s.releasePipe.runPlainThen(context.Background(), s.cfg.netTimeout(), nil, wi.Key, first, then)
}

// emptyWindow is the name under which the key memory remembers that the
// window of key was read empty (acquireWindow).
func emptyWindow(key string) string { return key + "\x00empty" }
