package node_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
)

// baseRecorder remembers the key base of the last store call, so that a
// test can ask the authority about the same limit directly.
type baseRecorder struct {
	node.Store
	mu   sync.Mutex
	base string
}

func (s *baseRecorder) Acquire(ctx context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	s.mu.Lock()
	s.base = r.Base
	s.mu.Unlock()
	return s.Store.Acquire(ctx, r)
}

func (s *baseRecorder) lastBase() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.base
}

// On a real redis-server and for every algorithm: after
// the authority denies cost 1, a check of cost 5 gets the retry_after the
// authority gives cost 5, not the one it gave cost 1. The node answers it
// locally where the denial determines that wait (fixed window; the buckets
// and GCRA here, at 100 per minute, a = 1) and asks Redis otherwise (the
// sliding windows). The case: GCRA 100/min burst 20, 0.596 s for
// cost 1, 2.996 s for cost 5; the cache used to say 0.596 s.
func TestCachedDenialGivesALargerCostItsOwnRetryAfter(t *testing.T) {
	r := redistest.Start(t)
	authority := newRedisStore(t, r)
	for _, alg := range algorithms.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			lim := algorithms.Limit{Algorithm: alg, Limit: 100, Period: time.Minute, Burst: 20}
			if alg == algorithms.FixedWindow || alg == algorithms.SlidingWindowLog || alg == algorithms.SlidingWindowCounter {
				// An hour, so that the window rarely ends during the test.
				lim = algorithms.Limit{Algorithm: alg, Limit: 20, Period: time.Hour}
			}
			rec := &baseRecorder{Store: newRedisStore(t, r)}
			counted := &countingStore{Store: rec}
			n := newNode(t, counted, node.Config{})
			p := node.Policy{Name: "retry", Limit: lim, Lease: node.LeaseOff}
			ctx := context.Background()

			if res, err := n.Check(ctx, p, "k", lim.Capacity()); err != nil || !res.Allowed {
				t.Fatalf("spending the capacity: %+v, %v", res, err)
			}
			callStart := time.Now()
			one, err := n.Check(ctx, p, "k", 1)
			call := time.Since(callStart)
			if err != nil || one.Allowed || one.Source != node.SourceStore {
				t.Fatalf("cost 1: %+v, %v; want a denial from the store", one, err)
			}
			calls := counted.Acquires.Load()

			t1 := time.Now()
			five, err := n.Check(ctx, p, "k", 5)
			if err != nil || five.Allowed {
				t.Fatalf("cost 5: %+v, %v; want a denial", five, err)
			}
			truth, _, err := authority.Acquire(ctx, node.AcquireRequest{Base: rec.lastBase(), Limit: lim, Cost: 5, Want: 5})
			t2 := time.Now()
			if err != nil || truth.Allowed {
				t.Fatalf("the authority on cost 5: %+v, %v; want a denial", truth, err)
			}
			t.Logf("%s: cost 1 waits %s, cost 5 %s (%s); the authority says %s",
				alg, one.RetryAfter, five.RetryAfter, five.Source, truth.RetryAfter)

			local := alg != algorithms.SlidingWindowLog && alg != algorithms.SlidingWindowCounter
			if made := counted.Acquires.Load() - calls; local && (five.Source != node.SourceDeniedCache || made != 0) {
				t.Errorf("cost 5 came from %s with %d store calls; want the denied cache", five.Source, made)
			} else if !local && five.Source != node.SourceStore {
				t.Errorf("cost 5 came from %s; only the authority knows this wait", five.Source)
			}
			// The node's answer came first, by t2 - t1 at most; a cached
			// one counts from before the call that brought the denial, so
			// it may be short by that call's duration (and 1 ms of
			// rounding each way).
			slack := 2 * time.Millisecond
			if d := five.RetryAfter - truth.RetryAfter; d > t2.Sub(t1)+slack || d < -(call+slack) {
				t.Errorf("cost 5 waits %s, the authority says %s (%s apart; allowed %s below to %s above)",
					five.RetryAfter, truth.RetryAfter, d, call+slack, t2.Sub(t1)+slack)
			}
			if alg == algorithms.GCRA {
				// The numbers: each unit takes 600 ms, less the
				// time between the two answers.
				if got := truth.RetryAfter - one.RetryAfter; got < 2400*time.Millisecond-t2.Sub(callStart)-slack || got > 2400*time.Millisecond+slack {
					t.Errorf("the authority's cost 5 waits %s more than cost 1; want 2.4s", got)
				}
			}
		})
	}
}
