package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/delayproxy"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

// Callers whose deadlines are shorter than --redis-timeout (Envoy's rate
// limit filter allows 20ms by default) still open the breaker on a Redis
// that stopped answering: each plain check's store call is a failure the
// breaker counts, even when its caller left before the call timed out.
func TestBreakerOpensUnderShortCallerDeadlines(t *testing.T) {
	r := redistest.Start(t)
	px := delayproxy.Start(t, r.Addr())
	store, err := redis.New(context.Background(), redis.Config{URL: "redis://" + px.Addr() + "/0", Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, store, node.Config{})
	big := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1_000_000, Period: time.Hour}
	policies := []node.Policy{
		{Name: "off", Limit: big, Lease: node.LeaseOff},
		{Name: "cold", Limit: big}, // each key checked once: never leases
	}
	for _, p := range policies {
		t.Run(p.Name, func(t *testing.T) {
			if res, err := n.Check(context.Background(), p, "warm", 1); err != nil || res.Source != node.SourceStore {
				t.Fatalf("before the stall: %+v, %v", res, err)
			}
			opens := n.Stats().BreakerOpens
			px.Stall(time.Hour)
			defer px.Stall(0)
			for i := range 8 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				_, err := n.Check(ctx, p, "k"+string(rune('a'+i)), 1)
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("check %d: %v", i, err)
				}
			}
			waitUntil(t, 10*time.Second, "the breaker to open", func() bool { return n.Stats().BreakerOpens > opens })
			px.Stall(0)
			waitUntil(t, 10*time.Second, "the breaker to close", func() bool { return !n.Stats().BreakerOpen })
		})
	}
}
