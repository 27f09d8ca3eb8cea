package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// This file is the fixed window's check without a script: plain INCRBY
// on the window's own key, for a node that knows Redis's clock is in that
// window for as long as the check may take (clock.go).

// acquireWindow makes r, a check of a fixed window limit, with plain
// commands (algorithms.WindowIncrement; the INCRBY alone for a window this
// node remembers counting, key_memory.go) when Redis's clock is sure to stay
// in one window from now until the check's deadline, by the node's
// estimate (redisClock.bounds). handled is false, and nothing was sent,
// when it is not: the check must go to the script, which reads the clock
// itself. A reply that comes before the deadline was written while
// Redis's clock was in that window, so the check counts in the window the
// script would have counted it in; a reply that comes after the caller left
// has what it took given back (what a charge recorded beyond a grant
// stays, as the script's late replies leave it).
func (s *Store) acquireWindow(ctx context.Context, pipe *pipeline, r node.AcquireRequest, prefix string, timeout time.Duration, span trace.Span) (d algorithms.Decision, g algorithms.Grant, handled bool, err error) {
	l := r.Limit
	start := time.Now()
	_, nowHi, ok := s.clock.bounds(0)
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
	wi, ok := algorithms.FixedWindowIncrement(l, prefix, w, r.Cost, r.Want, r.Charge)
	if !ok {
		return d, g, false, nil
	}
	// The decision's time: the latest Redis's clock may read now, so that
	// a lease, whose life the node counts from before the call, ends before
	// its window does.
	nowMs := min(max(nowHi, w), w+p-1)
	outcome := func(reply any) (algorithms.Decision, algorithms.Grant, int64, error) {
		count, err := windowCount(wi, reply)
		if err != nil {
			return algorithms.Decision{}, algorithms.Grant{}, 0, err
		}
		d, g, giveBack := wi.Outcome(count, nowMs)
		return d, g, giveBack, nil
	}
	var lateReply func(any)
	if wi.By > 0 {
		lateReply = func(reply any) {
			// The caller never had the grant: it goes back too.
			if _, g, giveBack, err := outcome(reply); err == nil && giveBack+g.Units > 0 {
				s.giveBackWindow(wi, giveBack+g.Units)
			}
		}
	}
	first, then := wi.Commands()
	// A window this node saw counting has its TTL already: its INCRBY
	// goes alone. (A wrong guess is caught by the reply: see below.)
	ttlSet := then != nil && s.known.holds(wi.Key, start)
	if ttlSet {
		then = nil
	}
	var reply any
	if then == nil {
		// GET of a missing key: a count of 0.
		if reply, err = pipe.runPlain(ctx, timeout, lateReply, wi.Key, first...); errors.Is(err, goredis.Nil) {
			reply, err = nil, nil
		}
	} else {
		reply, err = pipe.runPlainThen(ctx, timeout, lateReply, wi.Key, first, then)
	}
	if err != nil {
		return d, g, true, err
	}
	d, g, giveBack, err := outcome(reply)
	if err != nil {
		return d, g, true, err
	}
	if wi.By > 0 {
		if count, _ := windowCount(wi, reply); ttlSet && count == wi.By {
			// The key was guessed wrong (the window was new, or the key
			// expired or was reset since): the INCRBY created it, with
			// no TTL. Give it one now.
			_, _ = s.releasePipe.runPlain(context.Background(), s.cfg.netTimeout(), nil, wi.Key, wi.Expire()...)
		}
		_, end := wi.Window()
		s.known.note(wi.Key, start, end-nowMs)
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
	markPlain(span, windowOperation)
	return d, g, true, nil
}

// windowCount reads the count in reply: INCRBY's and PEXPIREAT's replies,
// or GET's (nil for a missing key, or goredis.Nil as the pipeline reports
// it).
func windowCount(wi algorithms.WindowIncrement, reply any) (int64, error) {
	if both, ok := reply.([]any); ok && len(both) == 2 {
		reply = both[0]
	}
	switch v := reply.(type) {
	case int64:
		return v, nil
	case nil:
		return 0, nil
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed state in %s: %q", wi.Key, v)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%w: the window's count is %T", algorithms.ErrBadReply, reply)
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
