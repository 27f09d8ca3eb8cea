package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

// Through Sentinel, every algorithm's limit holds across a failover and
// across the new master's death: the replica had replicated the counters,
// so checks carry on against the promoted server from where they were, and
// the store loads its scripts there (a replica never has them: SCRIPT LOAD
// is not replicated).
func TestRedisSentinelFailover(t *testing.T) {
	s := redistest.StartSentinel(t)
	ctx := context.Background()
	store, err := redis.New(ctx, redis.Config{
		SentinelAddrs: s.SentinelAddrs(), MasterName: s.MasterName(), Timeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	first, second := s.Master(), s.Replica()
	if missing, err := missingScripts(first); err != nil || missing != 0 {
		t.Fatalf("the master lacks %d scripts after redis.New (%v)", missing, err)
	}
	if missing, err := missingScripts(second); err != nil || missing == 0 {
		t.Fatalf("the replica has the scripts already (%d missing, %v): the reload would go untested", missing, err)
	}
	// A limit of 9 a year per algorithm, leases off so every check is the
	// master's decision: 3 allowed before each switch, 3 after the last.
	const limit = 9
	var policies []node.Policy
	for _, a := range algorithms.Algorithms() {
		policies = append(policies, node.Policy{
			Name:         "sentinel-" + a.String(),
			Limit:        algorithms.Limit{Algorithm: a, Limit: limit, Period: algorithms.MaxPeriod},
			Lease:        node.LeaseOff,
			OnStoreError: node.FailClosed,
		})
	}
	// Configured, so that their keys are the families keyBase names.
	n := newNode(t, store, node.Config{Policies: policies})
	allowed := make([]int, len(policies))
	// spend makes k allowed checks of every policy, the first few of which
	// may take the failure mode while the client learns of a new master.
	spend := func(k int, when string) {
		t.Helper()
		failed := 0
		defer func() { t.Logf("%s: %d fail-closed answers", when, failed) }()
		for i, p := range policies {
			deadline := time.Now().Add(10 * time.Second)
			for got := 0; got < k; {
				res, err := n.Check(ctx, p, "k", 1)
				switch {
				case err != nil:
					t.Fatalf("%s %s: %v", p.Name, when, err)
				case res.Source == node.SourceFailClosed:
					failed++
					if time.Now().After(deadline) {
						t.Fatalf("%s %s: still failing after 10s: %+v", p.Name, when, res)
					}
					time.Sleep(10 * time.Millisecond) // poll until the client has switched
				case res.Source != node.SourceStore || !res.Allowed || res.Remaining != int64(limit-allowed[i]-1):
					t.Fatalf("%s %s: check %d: %+v, want allowed by the store with %d remaining", p.Name, when, allowed[i]+1, res, limit-allowed[i]-1)
				default:
					allowed[i]++
					got++
				}
			}
		}
	}

	spend(3, "before the failover")
	s.WaitReplicated()
	if got := s.Failover(); got != second {
		t.Fatalf("sentinel promoted %s, want the replica %s", got.Addr(), second.Addr())
	}
	spend(3, "after the failover")
	for _, p := range policies {
		base := keyBase(p.Name, "k")
		if got, err := second.HoldsState(algorithms.Keys(p.Limit.Algorithm, base)[0]); err != nil || !got {
			t.Fatalf("%s: the new master has no state for it (%v, %v)", p.Name, got, err)
		}
	}
	waitScripts(t, second)

	// The new master dies; Sentinel promotes the old one, which has been
	// replicating it.
	s.WaitReplicated()
	second.Kill()
	s.WaitPromoted(first)
	spend(3, "after the second master died")
	for i, p := range policies {
		if allowed[i] != limit {
			t.Fatalf("%s: %d allowed, limit %d", p.Name, allowed[i], limit)
		}
		res, err := n.Check(ctx, p, "k", 1)
		if err != nil || res.Source != node.SourceStore || res.Allowed {
			t.Fatalf("%s: past the limit: %+v, %v", p.Name, res, err)
		}
	}
	waitScripts(t, first)
}
