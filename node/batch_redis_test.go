package node_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
)

// CheckAll under contention, on a real redis-server and on a 3-master
// Redis Cluster whose two limits live on different masters.

// batchFlood is how many concurrent batches the contention tests send, at
// most batchesInFlight at a time: ten thousand store calls at once would
// starve the store's dialer and pipeliners of the two CPUs of a loaded
// test machine, and time out.
const (
	batchFlood      = 10_000
	batchesInFlight = 256
)

// batchBackend is a store to run CheckAll on. open returns a function that
// makes stores sharing one state, so that a fresh node can read back what
// another did; key returns a key for policy whose limit lives on master
// i mod 3 of the cluster (in a slot of its own), and "k" elsewhere.
type batchBackend struct {
	name  string
	flood int // batches per flood
	open  func(t *testing.T) func() node.Store
	key   func(t *testing.T, policy string, i int) string
}

// sharedMemory is a memory store that several nodes share; the test closes
// it.
type sharedMemory struct{ *memory.Store }

func (sharedMemory) Close() error { return nil }

// patient is the per-call timeout of the Redis stores below: ten thousand
// concurrent batches queue their calls far beyond the default 50ms on a
// loaded machine, and a call that times out would fail open, which these
// tests count as a failure.
const patient = 30 * time.Second

// batchBackends: the memory store, which has no denied cache, so that every
// batch of a flood reaches it (and the flood is smaller); a redis-server;
// and a 3-master Redis Cluster.
func batchBackends(t *testing.T) []batchBackend {
	r := redistest.Start(t)
	c := redistest.StartCluster(t, 3)
	var firstSlots []int
	for i := range c.Len() {
		firstSlots = append(firstSlots, firstSlotOf(t, c, i))
	}
	k := func(*testing.T, string, int) string { return "k" }
	newStore := func(t *testing.T, cfg redis.Config) node.Store {
		s, err := redis.New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return []batchBackend{
		{"memory", 2_000, func(t *testing.T) func() node.Store {
			mem := memory.New(nil, 0)
			t.Cleanup(func() { mem.Close() })
			return func() node.Store { return sharedMemory{mem} }
		}, k},
		{"redis", batchFlood, func(t *testing.T) func() node.Store {
			return func() node.Store { return newStore(t, redis.Config{URL: r.URL(), Timeout: patient}) }
		}, k},
		{"cluster", batchFlood, func(t *testing.T) func() node.Store {
			return func() node.Store { return newStore(t, redis.Config{ClusterAddrs: c.Addrs(), Timeout: patient}) }
		}, func(t *testing.T, policy string, i int) string {
			master := i % c.Len()
			key := keyInSlot(t, c, policy, firstSlots[master])
			if c.Owner(c.Slot(keyBase(policy, key))) != master {
				t.Fatalf("%s's key is not on master %d", policy, master)
			}
			return key
		}},
	}
}

// flood sends count concurrent batches of items and returns how many were
// allowed. Every result must be a store or denied-cache decision, every
// item of a batch must share its outcome, and a denied batch must name an
// item over its limit.
func flood(t *testing.T, n *node.Node, count int, items []node.Item) int64 {
	t.Helper()
	var (
		allowed atomic.Int64
		wg      sync.WaitGroup
		failed  atomic.Value
	)
	start := make(chan struct{})
	inFlight := make(chan struct{}, batchesInFlight)
	for range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			inFlight <- struct{}{}
			defer func() { <-inFlight }()
			res, err := n.CheckAll(context.Background(), items)
			if err != nil {
				failed.Store(err.Error())
				return
			}
			over := false
			for _, r := range res {
				if r.Allowed != res[0].Allowed || r.Source >= node.SourceFailOpen {
					failed.Store(fmt.Sprintf("%+v", res))
					return
				}
				over = over || r.RetryAfter > 0
			}
			if res[0].Allowed {
				allowed.Add(1)
			} else if !over {
				failed.Store(fmt.Sprintf("a denied batch with no item over its limit: %+v", res))
			}
		}()
	}
	close(start)
	wg.Wait()
	if f := failed.Load(); f != nil {
		t.Fatalf("a batch: %s", f)
	}
	return allowed.Load()
}

// 10,000 concurrent batches on each backend: with one limit exhausted,
// they spend nothing on the others; with every limit free, exactly the
// smallest limit's worth is allowed.
func TestCheckAllUnderContention(t *testing.T) {
	for _, be := range batchBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			t.Run("one exhausted", func(t *testing.T) { oneExhausted(t, be) })
			t.Run("exactly the smallest", func(t *testing.T) { exactlyTheSmallest(t, be) })
		})
	}
}

// oneExhausted: with one limit exhausted, batches over it and a limit of
// each algorithm are all denied, and leave the other limits' counters as
// they were.
func oneExhausted(t *testing.T, be batchBackend) {
	// Policy names order the "a-" limits before b: every batch that
	// reaches the store takes a unit of each, then meets b, and gives them
	// back.
	var items []node.Item
	for i, alg := range algorithms.Algorithms() {
		p := node.Policy{Name: "a-" + alg.String(), Limit: algorithms.Limit{Algorithm: alg, Limit: 1000, Period: algorithms.MaxPeriod}, Lease: node.LeaseOff}
		items = append(items, node.Item{Policy: p, Key: be.key(t, p.Name, i), Cost: 1})
	}
	b := node.Policy{Name: "b-full", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 3, Period: algorithms.MaxPeriod}}
	items = append(items, node.Item{Policy: b, Key: be.key(t, b.Name, 1), Cost: 1})
	store := be.open(t)
	cs := &countingStore{Store: store()}
	n := newNode(t, cs, node.Config{})
	ctx := context.Background()
	for _, it := range items {
		spend := int64(7)
		if it.Policy.Name == b.Name {
			spend = 3
		}
		if res, err := n.Check(ctx, it.Policy, it.Key, spend); err != nil || !res.Allowed {
			t.Fatalf("spend %d of %s: %+v, %v", spend, it.Policy.Name, res, err)
		}
	}
	releases := cs.Releases.Load()
	start := time.Now()
	if got := flood(t, n, be.flood, items); got != 0 {
		t.Fatalf("%d batches allowed with b exhausted", got)
	}
	took := time.Since(start)
	// A fresh node, with nothing remembered, reads every limit at the
	// store.
	fresh := newNode(t, store(), node.Config{})
	for _, it := range items {
		want := int64(993)
		if it.Policy.Name == b.Name {
			want = 0
		}
		if got := remainingOf(t, fresh, it.Policy, it.Key); got != want {
			t.Errorf("%s: %d remaining after the flood, want %d", it.Policy.Name, got, want)
		}
	}
	t.Logf("%d batches in %s; %d units taken and given back; the other batches were denied before taking any",
		be.flood, took.Round(time.Millisecond), cs.Releases.Load()-releases)
}

// exactlyTheSmallest: with every limit free, batches over three limits get
// exactly the smallest limit allowed, though it is neither the first nor
// the last taken; the others keep the rest.
func exactlyTheSmallest(t *testing.T, be batchBackend) {
	limits := []struct {
		name  string
		alg   algorithms.Algorithm
		limit int64
	}{{"a", algorithms.GCRA, 80}, {"b", algorithms.FixedWindow, 50}, {"c", algorithms.SlidingWindowLog, 120}}
	var items []node.Item
	for i, l := range limits {
		p := node.Policy{Name: l.name, Limit: algorithms.Limit{Algorithm: l.alg, Limit: l.limit, Period: algorithms.MaxPeriod}}
		items = append(items, node.Item{Policy: p, Key: be.key(t, p.Name, i), Cost: 1})
	}
	store := be.open(t)
	n := newNode(t, store(), node.Config{})
	start := time.Now()
	if got := flood(t, n, be.flood, items); got != 50 {
		t.Fatalf("%d batches allowed, want 50", got)
	}
	t.Logf("%d batches in %s", be.flood, time.Since(start).Round(time.Millisecond))
	fresh := newNode(t, store(), node.Config{})
	for i, it := range items {
		if got, want := remainingOf(t, fresh, it.Policy, it.Key), limits[i].limit-50; got != want {
			t.Errorf("%s: %d remaining, want %d", it.Policy.Name, got, want)
		}
	}
}

// Three nodes on one Redis, each with single checks that lease and with
// batches over the same two limits: the units admitted by both never
// exceed either limit.
func TestCheckAllNeverOverEitherLimitAcrossNodesWithLeases(t *testing.T) {
	r := redistest.Start(t)
	const k = 3
	nodes := make([]*node.Node, k)
	for i := range nodes {
		// A larger lease share than the default, so that the single checks
		// lease even with these small limits.
		nodes[i] = newNode(t, newRedisStore(t, r), node.Config{Cluster: quotadtest.SizedCluster(k), Lease: node.LeaseConfig{MaxFraction: 0.5}})
	}
	a := node.Policy{Name: "a", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 600, Period: algorithms.MaxPeriod}}
	b := node.Policy{Name: "b", Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowCounter, Limit: 400, Period: algorithms.MaxPeriod}}
	var singlesA, singlesB, batches, denied atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	stop := time.Now().Add(time.Second)
	for _, n := range nodes {
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					switch g % 3 {
					case 0, 1:
						p, count := a, &singlesA
						if g%3 == 1 {
							p, count = b, &singlesB
						}
						res, err := n.Check(ctx, p, "k", 1)
						if err != nil || res.Source >= node.SourceFailOpen {
							t.Errorf("check: %+v, %v", res, err)
							return
						}
						if res.Allowed {
							count.Add(1)
						}
					default:
						res, err := n.CheckAll(ctx, []node.Item{{Policy: a, Key: "k", Cost: 1}, {Policy: b, Key: "k", Cost: 1}})
						if err != nil || res[0].Source >= node.SourceFailOpen || res[1].Source >= node.SourceFailOpen {
							t.Errorf("batch: %+v, %v", res, err)
							return
						}
						if res[0].Allowed {
							batches.Add(1)
						} else {
							denied.Add(1)
						}
					}
				}
			}()
		}
	}
	wg.Wait()
	var leases int64
	for _, n := range nodes {
		leases += n.Stats().LeasesGranted
	}
	t.Logf("a: %d single + %d batches of 600; b: %d single + %d batches of 400; %d batches denied; %d leases granted",
		singlesA.Load(), batches.Load(), singlesB.Load(), batches.Load(), denied.Load(), leases)
	if usedA := singlesA.Load() + batches.Load(); usedA > 600 {
		t.Errorf("a admitted %d units, limit 600", usedA)
	}
	if usedB := singlesB.Load() + batches.Load(); usedB > 400 {
		t.Errorf("b admitted %d units, limit 400", usedB)
	}
	if leases == 0 || batches.Load() == 0 || denied.Load() == 0 {
		t.Fatalf("%d leases, %d batches allowed and %d denied: the test exercised too little", leases, batches.Load(), denied.Load())
	}
}
