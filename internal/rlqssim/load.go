package rlqssim

import (
	"context"
	"sync/atomic"
	"time"
)

// Load offers requests of one bucket to an Envoy at a steady rate.
type Load struct {
	offered, allowed atomic.Uint64
	done             chan struct{}
}

// Drive offers requests of id to e at rate a second, evenly spread,
// until ctx is done. It catches up after a late wake-up, so that the rate
// offered holds over time on a loaded machine.
func Drive(ctx context.Context, e *Envoy, id map[string]string, rate float64) *Load {
	l := &Load{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		start := time.Now()
		var sent uint64
		for ctx.Err() == nil {
			due := uint64(time.Since(start).Seconds() * rate)
			for ; sent < due && ctx.Err() == nil; sent++ {
				l.offered.Add(1)
				if e.Request(id) {
					l.allowed.Add(1)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return l
}

// Counts returns the requests offered and allowed so far.
func (l *Load) Counts() (offered, allowed uint64) { return l.offered.Load(), l.allowed.Load() }

// Wait returns once the load stopped (its ctx is done).
func (l *Load) Wait() { <-l.done }
