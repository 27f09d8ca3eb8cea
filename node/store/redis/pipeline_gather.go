package redis

import "time"

// This file is how a pipeliner gathers its next round trip: the call that
// wakes it, whatever else is queued, and, with a batch window, the calls
// that come soon after while calls come fast.

// arrived notes that a call is being queued now, for the smoothed gap
// between calls, and returns the time since the call before it (-1 for
// the first call).
func (p *pipeline) arrived() time.Duration {
	seen := p.pending.Add(1) - 1
	if p.window <= 0 {
		return -1
	}
	o := p.others.Load()
	p.others.Store(o + (seen*companyScale-o)/gapWeight)
	now := int64(time.Since(p.epoch))
	last := p.lastCall.Swap(now)
	if last == 0 {
		return -1
	}
	d := min(now-last, gapCap*int64(p.window))
	g := p.gap.Load()
	p.gap.Store(g + (d-g)/gapWeight)
	return time.Duration(d)
}

// gather waits for a call, takes it and whatever else is queued (up to
// maxPipeline), and, while calls come faster than one per window and
// beside others (not one caller calling back to back), waits for more:
// until the batch is full, the window since the first call has passed, or
// no call has come for quietGaps usual gaps. A call that came after a
// pause of more than a window goes at once, and a batch holding a call
// whose deadline is near (it queued behind a slow Redis, or its caller
// allowed it little time) goes as soon as that call is in it, so a quiet
// node never waits and a wait never costs a call its deadline. It reports
// false if the pipeline stopped first.
func (p *pipeline) gather(batch []*scriptCall, timer *time.Timer) ([]*scriptCall, bool) {
	select {
	case <-p.stop:
		return batch, false
	case c := <-p.queue:
		batch = append(batch, c)
	}
	first := time.Now()
	batch = p.drain(batch)
	if p.window <= 0 || len(batch) >= maxPipeline {
		return batch, true
	}
	gap := time.Duration(p.gap.Load())
	if c := batch[0]; gap <= 0 || gap >= p.window || c.gap < 0 || c.gap >= p.window || p.others.Load() < companyScale/2 {
		return batch, true
	}
	if p.urgent(batch, first) {
		return batch, true
	}
	p.waited.Add(1)
	end := first.Add(p.window)
	for len(batch) < maxPipeline {
		wait := min(time.Until(end), quietGaps*gap)
		if wait <= 0 {
			break
		}
		timer.Reset(wait)
		select {
		case c := <-p.queue:
			timer.Stop()
			n := len(batch)
			batch = p.drain(append(batch, c))
			if p.urgent(batch[n:], time.Now()) {
				return batch, true
			}
			continue
		case <-timer.C:
		case <-p.stop:
			timer.Stop()
		}
		break
	}
	return batch, true
}

// urgent reports whether any of calls has, at now, less time left than
// two windows and two smoothed round trips: such a call must not wait for
// company. On a Redis whose round trips take a good part of the call
// timeout, no call waits.
func (p *pipeline) urgent(calls []*scriptCall, now time.Time) bool {
	margin := 2*p.window + 2*time.Duration(p.lastRTT.Load())
	for _, c := range calls {
		if c.deadline.Sub(now) < margin {
			return true
		}
		if d, ok := c.ctx.Deadline(); ok && d.Sub(now) < margin {
			return true
		}
	}
	return false
}

// drain adds to batch whatever is queued, up to maxPipeline calls.
func (p *pipeline) drain(batch []*scriptCall) []*scriptCall {
	for len(batch) < maxPipeline {
		select {
		case c := <-p.queue:
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}
