package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// This file is the node's estimate of Redis's clock, for the fixed
// window's plain commands (windows.go): which window Redis's TIME is in,
// known within a bound, so that a check far from a window's edge needs no
// script to read the clock.

// clockSampleEvery is how often the estimate is renewed.
const clockSampleEvery = time.Second

// clockStale is how old the last good sample may be before the estimate
// is not used: a few missed samples, not a Redis that stopped answering.
const clockStale = 3 * clockSampleEvery

// clockDriftPPM bounds how fast Redis's clock and the node's monotonic
// clock may drift apart, in parts per million: NTP slews a clock by at most
// 500 ppm, so an estimate widens by 0.5 ms per second of age.
const clockDriftPPM = 500

// clockMargin widens every estimate by a fixed amount: TIME is read in whole
// microseconds and the scripts truncate it to whole milliseconds.
const clockMargin = 2 * time.Millisecond

// redisClock estimates Redis's clock from the node's monotonic clock. Each
// sample reads the monotonic clock, then TIME (on every primary of a
// Redis Cluster, each of which runs its own clock), then the monotonic
// clock again: each primary's TIME was read between the two, which
// bounds the offset between the clocks. The estimate is the union of the
// primaries' bounds, so it holds for every key whichever primary serves
// it. Safe for concurrent use.
//
// The bound assumes Redis's clock is not stepped between two samples by
// more than clockMargin: a sample that disagrees with the one before by
// more than the drift allows (a step, a failover to a primary whose clock
// differs) is not used, nor is any until the next one agrees with it.
type redisClock struct {
	origin time.Time // the monotonic clock's origin
	// est is the last sample; nil before the first.
	est atomic.Pointer[clockEstimate]
}

// clockEstimate is one sample: Redis's time at monotonic instant x (µs
// since origin) is within [x + lo, x + hi] µs since the Unix epoch. at is
// when it was sampled (µs since origin); steady counts the samples in a
// row, this one included, that agreed with the one before.
type clockEstimate struct {
	lo, hi, at int64
	steady     int
}

func newRedisClock() *redisClock { return &redisClock{origin: time.Now()} }

// since is the monotonic clock: µs since origin, at least 1.
func (c *redisClock) since() int64 { return time.Since(c.origin).Microseconds() + 1 }

// sample reads TIME on every primary of client and renews the estimate.
// Samples are taken one at a time (the store's clock loop).
func (c *redisClock) sample(ctx context.Context, client goredis.UniversalClient) error {
	var mu sync.Mutex
	var lo, hi int64
	first := true
	read := func(ctx context.Context, rc goredis.Cmdable) error {
		before := c.since()
		t, err := rc.Time(ctx).Result()
		after := c.since()
		if err != nil {
			return err
		}
		at := t.UnixMicro()
		mu.Lock()
		defer mu.Unlock()
		if l, h := at-after, at-before; first {
			lo, hi, first = l, h, false
		} else {
			lo, hi = min(lo, l), max(hi, h)
		}
		return nil
	}
	var err error
	if cc, ok := client.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, rc *goredis.Client) error { return read(ctx, rc) })
	} else {
		err = read(ctx, client)
	}
	if err != nil || first {
		return err
	}
	c.accept(lo, hi, c.since())
	return nil
}

// accept takes a sample, bounds [lo, hi] taken at now (µs since origin).
func (c *redisClock) accept(lo, hi, now int64) {
	next := &clockEstimate{lo: lo, hi: hi, at: now, steady: 1}
	if prev := c.est.Load(); prev != nil {
		// The previous bounds, widened by the drift since: a sample outside
		// them means a clock that stepped.
		widen := (now-prev.at)*clockDriftPPM/1_000_000 + clockMargin.Microseconds()
		if hi >= prev.lo-widen && lo <= prev.hi+widen {
			next.steady = prev.steady + 1
		}
	}
	c.est.Store(next)
}

// bounds returns the bounds, in ms since the Unix epoch, of Redis's time
// during the span from now to now + d on the node's clock, widened by the
// drift since the sample and by clockMargin; ok is false when there is no
// estimate to use: none recent, or the last two samples disagreed.
func (c *redisClock) bounds(d time.Duration) (loMs, hiMs int64, ok bool) {
	e := c.est.Load()
	now := c.since()
	if e == nil || e.steady < 2 || now-e.at > clockStale.Microseconds() {
		return 0, 0, false
	}
	widen := (now-e.at+d.Microseconds())*clockDriftPPM/1_000_000 + clockMargin.Microseconds()
	lo := now + e.lo - widen
	hi := now + d.Microseconds() + e.hi + widen
	return floorDiv(lo, 1000), floorDiv(hi, 1000) + 1, true
}

// nowMs is the middle of the estimate of Redis's time now, in ms since the
// Unix epoch, or the node's own clock when there is no estimate to use:
// a guess, for the key a fixed window's script call names
// (algorithms.ScriptKeys).
func (c *redisClock) nowMs() int64 {
	if lo, hi, ok := c.bounds(0); ok {
		return lo + (hi-lo)/2
	}
	return time.Now().UnixMilli()
}

// floorDiv is ⌊x / y⌋ for y > 0.
func floorDiv(x, y int64) int64 {
	q := x / y
	if x%y < 0 {
		q--
	}
	return q
}
