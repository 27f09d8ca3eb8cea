package node_test

import (
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/accuracy"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

// A hot key with leases off is not decided one Redis call at a time: its
// concurrent checks reach Redis together (several checks per EVALSHA, so
// several were in flight at once), and still no algorithm admits more
// than its limit.
func TestLeaseOffHotKeyIsPipelinedWithoutOverAdmission(t *testing.T) {
	r := redistest.Start(t)
	const (
		limit  = 300
		period = 250 * time.Millisecond
		run    = time.Second
	)
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			nodes, stores := cluster(t, r, 2)
			p := node.Policy{Name: "off", Limit: algorithms.Limit{Algorithm: a, Limit: limit, Period: period}, Lease: node.LeaseOff}
			start := time.Now()
			allowed, total := hammer(t, nodes, p, "hot", 8, start.Add(run))
			share := accuracy.NoOverAdmission(t, a, limit, period, start, run, allowed)
			var calls, scripts int64
			for _, s := range stores {
				calls += s.Acquires.Load()
				scripts += s.Store.(*redis.Store).ScriptCalls()
			}
			t.Logf("%s: %d checks, %d allowed (%.1f%% of what the limit permits), %d store calls in %d EVALSHAs", a, total, len(allowed), 100*share, calls, scripts)
			if scripts >= calls {
				t.Errorf("%d store calls in %d EVALSHAs: the key's checks never reached Redis together", calls, scripts)
			}
		})
	}
}

// A denied flood on a key with leases off still costs Redis only the calls
// in flight when a denial comes back, then about one per retry_after: the
// rest are answered from the remembered denial and the denied cache.
func TestLeaseOffDeniedFloodIsAnsweredLocally(t *testing.T) {
	r := redistest.Start(t)
	nodes, stores := cluster(t, r, 2)
	const perNode = 4
	p := node.Policy{Name: "off-flood", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: 300 * time.Millisecond}, Lease: node.LeaseOff}
	start := time.Now()
	allowed, total := hammer(t, nodes, p, "abuser", perNode, start.Add(1500*time.Millisecond))
	windows := int64(time.Since(start)/p.Limit.Period) + 2
	var cached int64
	for i, n := range nodes {
		den := stores[i].Denials.Load()
		cached += n.Stats().DeniedCacheHits
		t.Logf("node %d: %d store denials over %d windows", i, den, windows)
		// Each window: the checks in flight when the first denial came
		// back, plus TestDeniedFloodIsAnsweredLocally's two at the turn.
		if den > (perNode+2)*windows {
			t.Errorf("node %d: %d store denials over %d windows; want at most %d per window", i, den, windows, perNode+2)
		}
	}
	if int64(len(allowed)) > windows*5 {
		t.Errorf("%d allowed over %d windows of 5", len(allowed), windows)
	}
	if cached == 0 || total < 10*windows {
		t.Errorf("%d checks, %d denied-cache hits: the flood did not exercise the cache", total, cached)
	}
}
