package cluster_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

// The helpers of package node's tests that the cluster's tests share.

var fiveAMinute = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: time.Minute}

func newNode(t *testing.T, store node.Store, cfg node.Config) *node.Node {
	t.Helper()
	n, err := node.New(cfg, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func newRedisStore(t *testing.T, r *redistest.Server) *redis.Store {
	t.Helper()
	s, err := redis.New(context.Background(), redis.Config{URL: r.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// countingStore counts a store's calls.
type countingStore struct {
	node.Store
	acquires, denials, releases atomic.Int64
}

func (s *countingStore) Acquire(ctx context.Context, base string, l algorithms.Limit, cost, want int64, hold time.Duration) (algorithms.Decision, algorithms.Grant, error) {
	s.acquires.Add(1)
	d, g, err := s.Store.Acquire(ctx, base, l, cost, want, hold)
	if err == nil && !d.Allowed {
		s.denials.Add(1)
	}
	return d, g, err
}

func (s *countingStore) Release(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	s.releases.Add(1)
	return s.Store.Release(ctx, base, l, units, g)
}

func (s *countingStore) calls() int64 { return s.acquires.Load() + s.releases.Load() }

// CallTimeout passes on the wrapped store's per-call timeout, which bounds
// how long the node coalesces checks on one key.
func (s *countingStore) CallTimeout() time.Duration {
	if ct, ok := s.Store.(interface{ CallTimeout() time.Duration }); ok {
		return ct.CallTimeout()
	}
	return redis.DefaultTimeout
}
