package node_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	redisstore "github.com/quotad/quotad/node/store/redis"
)

// flakyStore is a remote-looking memory store that fails every call while
// down is set, and counts the calls that reach it.
type flakyStore struct {
	remoteMemory
	down            atomic.Bool
	acquires, pings atomic.Int64
	// overloaded fails every Acquire with node.ErrOverloaded; overloadKey
	// (set between calls) those of the key bases it starts.
	overloaded  atomic.Bool
	overloadKey string
}

var errOverloaded = fmt.Errorf("%w: flaky store's call waited too long in the node", node.ErrOverloaded)

var errFlaky = errors.New("flaky store is down")

func (s *flakyStore) Acquire(ctx context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	s.acquires.Add(1)
	if s.down.Load() {
		return algorithms.Decision{}, algorithms.Grant{}, errFlaky
	}
	if s.overloaded.Load() || s.overloadKey != "" && strings.HasPrefix(r.Base, s.overloadKey) {
		return algorithms.Decision{}, algorithms.Grant{}, errOverloaded
	}
	return s.remoteMemory.Acquire(ctx, r)
}

func (s *flakyStore) Release(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	if s.down.Load() {
		return 0, errFlaky
	}
	return s.remoteMemory.Release(ctx, base, l, units, g)
}

func (s *flakyStore) Ping(context.Context) error {
	s.pings.Add(1)
	if s.down.Load() {
		return errFlaky
	}
	return nil
}

// waitUntil polls cond until it holds, failing t after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The breaker opens after Failures store errors in a row; while open, no
// check reaches the store, keys holding a lease keep spending it, and the
// failure mode answers the rest; a ping that succeeds closes it.
func TestBreakerOpensAndCloses(t *testing.T) {
	store := &flakyStore{remoteMemory: remoteMemory{memory.New(nil, 0)}}
	n := newNode(t, store, node.Config{
		Breaker: node.BreakerConfig{Failures: 3, ProbeEvery: 10 * time.Millisecond},
		Lease:   node.LeaseConfig{Horizon: time.Second, Hold: time.Hour},
	})
	var changes []bool
	var mu sync.Mutex
	n.OnStoreAvailability(func(ok bool) { mu.Lock(); changes = append(changes, ok); mu.Unlock() })
	ctx := context.Background()
	direct := node.Policy{Name: "direct", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: time.Hour}, Lease: node.LeaseOff, OnStoreError: node.FailClosed}
	leased := node.Policy{Name: "leased", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1_000_000_000, Period: time.Hour}}
	for i := 0; n.Stats().UnitsHeld < 1000; i++ {
		if i > 1_000_000 {
			t.Fatal("no lease after 1M checks")
		}
		if _, err := n.Check(ctx, leased, "hot", 1); err != nil {
			t.Fatal(err)
		}
	}

	store.down.Store(true)
	before := store.acquires.Load()
	for i := range 3 {
		if res, err := n.Check(ctx, direct, "k", 1); err != nil || res.Source != node.SourceFailClosed || res.Allowed {
			t.Fatalf("failure %d: %+v, %v", i+1, res, err)
		}
	}
	if st := n.Stats(); !st.BreakerOpen || st.BreakerOpens != 1 || st.StoreErrors != 3 || n.StoreAvailable() {
		t.Fatalf("after 3 failures in a row: %+v", st)
	}
	tried := store.acquires.Load()
	if tried-before != 3 {
		t.Fatalf("%d store calls for 3 checks", tried-before)
	}
	for range 50 {
		if res, _ := n.Check(ctx, direct, "k", 1); res.Source != node.SourceFailClosed {
			t.Fatalf("while open: %+v", res)
		}
		if res, _ := n.Check(ctx, leased, "hot", 1); res.Source != node.SourceLease || !res.Allowed {
			t.Fatalf("a key holding a lease stopped spending it: %+v", res)
		}
	}
	if got := store.acquires.Load(); got != tried {
		t.Fatalf("the open breaker let %d calls reach the store", got-tried)
	}
	waitUntil(t, 5*time.Second, "probes", func() bool { return store.pings.Load() >= 2 })

	store.down.Store(false)
	waitUntil(t, 5*time.Second, "the breaker to close", n.StoreAvailable)
	if res, err := n.Check(ctx, direct, "k", 1); err != nil || res.Source != node.SourceStore || !res.Allowed {
		t.Fatalf("after the store came back: %+v, %v", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 2 || changes[0] || !changes[1] {
		t.Fatalf("availability changes %v, want [false true]", changes)
	}
}

// redis-server killed under load and restarted: an open policy keeps
// allowing and a closed one denies, both marked; once the breaker is open
// no check reaches Redis; after the restart decisions come from the store
// again, with the scripts reloaded; no goroutine outlives the node.
func TestRedisKilledUnderLoad(t *testing.T) {
	r := redistest.Start(t)
	goroutines := runtime.NumGoroutine()
	inner, err := redisstore.New(context.Background(), redisstore.Config{URL: r.URL(), Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	store := &countingStore{Store: inner}
	n, err := node.New(node.Config{Breaker: node.BreakerConfig{ProbeEvery: 50 * time.Millisecond}}, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := algorithms.Limit{Algorithm: algorithms.SlidingWindowCounter, Limit: 1_000_000_000, Period: time.Hour}
	open := node.Policy{Name: "open", Limit: big, OnStoreError: node.FailOpen}
	closed := node.Policy{Name: "closed", Limit: big, OnStoreError: node.FailClosed, Lease: node.LeaseOff}

	// Each checker records the sources it saw in the current phase.
	type phase struct {
		mu      sync.Mutex
		sources map[string]map[node.Source]int
		errs    []error
		slowest time.Duration
	}
	var cur atomic.Pointer[phase]
	newPhase := func() *phase {
		p := &phase{sources: map[string]map[node.Source]int{"open": {}, "closed": {}}}
		cur.Store(p)
		return p
	}
	newPhase()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		p := []node.Policy{open, closed}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				res, err := n.Check(context.Background(), p, []string{"a", "b", "c"}[k%3], 1)
				took := time.Since(start)
				ph := cur.Load()
				ph.mu.Lock()
				if err != nil {
					ph.errs = append(ph.errs, err)
				} else {
					ph.sources[p.Name][res.Source]++
					if res.Source == node.SourceFailOpen && !res.Allowed || res.Source == node.SourceFailClosed && res.Allowed {
						ph.errs = append(ph.errs, errors.New("failure mode answered the wrong way"))
					}
				}
				ph.slowest = max(ph.slowest, took)
				ph.mu.Unlock()
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			wg.Wait()
		}
	}()
	seen := func(ph *phase, policy string, s node.Source) bool {
		ph.mu.Lock()
		defer ph.mu.Unlock()
		return ph.sources[policy][s] > 0
	}

	healthy := cur.Load()
	waitUntil(t, 10*time.Second, "store decisions before the kill", func() bool { return seen(healthy, "closed", node.SourceStore) })

	r.Kill()
	waitUntil(t, 10*time.Second, "the breaker to open", func() bool { return n.Stats().BreakerOpen })
	down := newPhase()
	callsWhenOpen := store.Calls()
	waitUntil(t, 10*time.Second, "both failure modes", func() bool {
		return seen(down, "open", node.SourceFailOpen) && seen(down, "closed", node.SourceFailClosed)
	})
	if got := store.Calls(); got != callsWhenOpen {
		t.Errorf("%d store calls were tried while the breaker was open", got-callsWhenOpen)
	}

	restarted := time.Now()
	r.Restart()
	up := newPhase()
	waitUntil(t, 10*time.Second, "store decisions after the restart", func() bool {
		return seen(up, "closed", node.SourceStore) && (seen(up, "open", node.SourceStore) || seen(up, "open", node.SourceLease))
	})
	backAfter := time.Since(restarted)
	close(stop)
	wg.Wait()

	for _, ph := range []*phase{healthy, down, up} {
		if len(ph.errs) > 0 {
			t.Errorf("checks failed: %v", ph.errs[0])
		}
	}
	down.mu.Lock()
	t.Logf("while down: %v; slowest check %s; back on the store %s after the restart",
		down.sources, down.slowest, backAfter.Round(time.Millisecond))
	down.mu.Unlock()

	// The store reloaded its scripts on the restarted server.
	rc := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rc.Close()
	var shas []string
	for _, a := range algorithms.Algorithms() {
		shas = append(shas, redis.NewScript(algorithms.CheckScript(a)).Hash(), redis.NewScript(algorithms.ReleaseScript(a)).Hash())
	}
	waitUntil(t, 10*time.Second, "every script to be reloaded", func() bool {
		exists, err := rc.ScriptExists(context.Background(), shas...).Result()
		if err != nil {
			return false
		}
		for _, e := range exists {
			if !e {
				return false
			}
		}
		return true
	})

	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	waitUntil(t, 10*time.Second, "goroutines to end", func() bool { return runtime.NumGoroutine() <= goroutines })
}

// A store call the node did not get to in time while the store answered
// (node.ErrOverloaded) is the node's failure, not the store's: however
// many in a row, the breaker stays closed and counts none as a store
// error; no check takes its failure mode, open or closed, but fails with
// the error; an all-or-nothing batch fails with it too, after giving back
// what its earlier items took.
func TestOverloadIsShedNotTakenForAStoreFailure(t *testing.T) {
	store := &flakyStore{remoteMemory: remoteMemory{memory.New(nil, 0)}}
	n := newNode(t, store, node.Config{Breaker: node.BreakerConfig{Failures: 3, ProbeEvery: 10 * time.Millisecond}})
	ctx := context.Background()
	lim := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: time.Hour}
	open := node.Policy{Name: "open", Limit: lim, Lease: node.LeaseOff, OnStoreError: node.FailOpen}
	closed := node.Policy{Name: "closed", Limit: lim, Lease: node.LeaseOff, OnStoreError: node.FailClosed}

	store.overloaded.Store(true)
	for i := range 10 {
		for _, p := range []node.Policy{open, closed} {
			if res, err := n.Check(ctx, p, "k", 1); !errors.Is(err, node.ErrOverloaded) {
				t.Fatalf("check %d of %s on an overloaded node: %+v, %v; want node.ErrOverloaded", i, p.Name, res, err)
			}
		}
	}
	if st := n.Stats(); st.BreakerOpen || st.BreakerOpens != 0 || st.StoreErrors != 0 || st.StoreOverloads != 20 {
		t.Fatalf("after 20 overloaded calls: breaker open %t, opened %d times, %d store errors, %d overloads; want closed, 0, 0, 20",
			st.BreakerOpen, st.BreakerOpens, st.StoreErrors, st.StoreOverloads)
	}

	// The batch takes "a" from the store, then "b" is overloaded.
	store.overloaded.Store(false)
	store.overloadKey = "{quotad:closed:b}" // and the inline limit's variant
	_, err := n.CheckAll(ctx, []node.Item{{Policy: closed, Key: "a", Cost: 5}, {Policy: closed, Key: "b", Cost: 5}})
	if !errors.Is(err, node.ErrOverloaded) {
		t.Fatalf("a batch with an overloaded item: %v, want node.ErrOverloaded", err)
	}
	store.overloadKey = ""
	if res, err := n.Check(ctx, closed, "a", 0); err != nil || res.Remaining != lim.Limit {
		t.Fatalf("after the shed batch, a has %+v (%v), want all %d remaining", res, err, lim.Limit)
	}
}
