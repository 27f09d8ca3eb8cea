// Package nodetest holds what the tests of node and node/cluster share: a
// node that closes with its test, a Redis store on a test's redis-server,
// and a store that counts the node's calls. Test helper only.
package nodetest

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

// New starts a node on store with cfg and closes it when t ends.
func New(t testing.TB, store node.Store, cfg node.Config) *node.Node {
	t.Helper()
	n, err := node.New(cfg, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// RedisStore is a Redis store on r whose calls may take a second: tests
// under -race on a loaded machine must not fail open at the 50ms default.
func RedisStore(t testing.TB, r *redistest.Server) *redis.Store {
	t.Helper()
	s, err := redis.New(context.Background(), redis.Config{URL: r.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// CountingStore counts the calls a node makes to the store it wraps, and
// how many of the checks among them came back denied. Safe for concurrent
// use.
type CountingStore struct {
	node.Store
	Acquires, Denials, Releases atomic.Int64
}

// Acquire implements node.Store.
func (s *CountingStore) Acquire(ctx context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	s.Acquires.Add(1)
	d, g, err := s.Store.Acquire(ctx, r)
	if err == nil && !d.Allowed {
		s.Denials.Add(1)
	}
	return d, g, err
}

// Release implements node.Store.
func (s *CountingStore) Release(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	s.Releases.Add(1)
	return s.Store.Release(ctx, base, l, units, g)
}

// Calls is the acquires and releases so far.
func (s *CountingStore) Calls() int64 { return s.Acquires.Load() + s.Releases.Load() }

// CallTimeout passes on the wrapped store's per-call timeout, which bounds
// how long the node coalesces checks on one key.
func (s *CountingStore) CallTimeout() time.Duration {
	if ct, ok := s.Store.(interface{ CallTimeout() time.Duration }); ok {
		return ct.CallTimeout()
	}
	return redis.DefaultTimeout
}
