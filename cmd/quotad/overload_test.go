package main

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// Attacks that drive one quotad node past what it can do in time, on a
// healthy Redis: the node must shed what it cannot do with an error the
// caller's own failure handling sees, never with a policy's failure mode
// (which would stop limiting, or deny everyone), and never open its
// circuit breaker, which judges Redis. Redis runs as on a machine of its
// own (redistest.OwnMachine): beside a test that keeps every core busy, a
// Redis competing for them answers late, and is then rightly judged slow.

// overloadConfig is the policies of the overload tests: "flood", which
// the attacker's items name, and a legitimate client's "legit-open" and
// "legit-closed", 100 a minute each, failing open and closed.
const overloadConfig = `policies:
  - name: flood
    algorithm: fixed_window
    limit: 1000000
    period: 1m
    on_store_error: open
    lease: off
  - name: legit-open
    algorithm: fixed_window
    limit: 100
    period: 1m
    on_store_error: open
  - name: legit-closed
    algorithm: fixed_window
    limit: 100
    period: 1m
    on_store_error: closed
`

// legitLimit is legit-open's and legit-closed's limit.
const legitLimit = 100

// processWatch samples a quotad process's goroutines (go_goroutines, from
// /metrics) and its breaker (/status) until stopped.
type processWatch struct {
	peakGoroutines atomic.Int64
	breakerOpen    atomic.Bool // seen open at least once
	samples        atomic.Int64
	stop, done     chan struct{}
}

func watchProcess(t *testing.T, base string) *processWatch {
	w := &processWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			if fams, err := scrapeOnce(base); err == nil {
				if g, ok := metricValue(fams, "go_goroutines", nil); ok && int64(g) > w.peakGoroutines.Load() {
					w.peakGoroutines.Store(int64(g))
				}
				w.samples.Add(1)
			}
			if st, err := readStatus(base); err == nil && st.Store.Breaker == "open" {
				w.breakerOpen.Store(true)
			}
		}
	}()
	t.Cleanup(w.end)
	return w
}

// end stops the sampling; it may be called more than once.
func (w *processWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// legitClient checks one key of a legit policy, back to back, until
// stopped, and counts what it was answered.
type legitClient struct {
	allowed, denied, failOpen, failClosed, shed, errs atomic.Int64
	lastErr                                           atomic.Value // string
}

// check sends one check and counts its answer; it returns the answer,
// nil if the check failed.
func (c *legitClient) check(ctx context.Context, client quotadv1connect.QuotaServiceClient, policy, key string) *quotadv1.CheckResponse {
	res, err := client.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: policy, Key: key}))
	switch {
	case isShed(err):
		c.shed.Add(1)
		return nil
	case err != nil:
		c.errs.Add(1)
		c.lastErr.Store(err.Error())
		return nil
	}
	switch res.Msg.GetSource() {
	case quotadv1.Source_SOURCE_FAIL_OPEN:
		c.failOpen.Add(1)
	case quotadv1.Source_SOURCE_FAIL_CLOSED:
		c.failClosed.Add(1)
	}
	if res.Msg.GetAllowed() {
		c.allowed.Add(1)
	} else {
		c.denied.Add(1)
	}
	return res.Msg
}

// run checks back to back until stop is closed.
func (c *legitClient) run(ctx context.Context, client quotadv1connect.QuotaServiceClient, policy, key string, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		c.check(ctx, client, policy, key)
	}
}

// untilDenied checks back to back until the store denies the key (its
// limit is reached), for at most 10s.
func (c *legitClient) untilDenied(ctx context.Context, t *testing.T, client quotadv1connect.QuotaServiceClient, policy, key string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if res := c.check(ctx, client, policy, key); res != nil && !res.GetAllowed() && res.GetSource() != quotadv1.Source_SOURCE_FAIL_CLOSED {
			return
		}
	}
	t.Errorf("%s: never denied by its limit: %v", policy, c)
}

func (c *legitClient) String() string {
	last, _ := c.lastErr.Load().(string)
	return fmt.Sprintf("%d allowed, %d denied (%d fail-open, %d fail-closed answers), %d shed as overloaded, %d other errors (last: %q)",
		c.allowed.Load(), c.denied.Load(), c.failOpen.Load(), c.failClosed.Load(), c.shed.Load(), c.errs.Load(), last)
}

// checkLegit fails t unless c was admitted legitLimit times (fewer by at
// most the checks shed), never answered by a failure mode, and failed
// only when shed.
func checkLegit(t *testing.T, name string, c *legitClient) {
	t.Helper()
	t.Logf("%s: %v", name, c)
	if c.failOpen.Load() != 0 || c.failClosed.Load() != 0 {
		t.Errorf("%s: answered by its failure mode on a healthy Redis: %v", name, c)
	}
	if c.errs.Load() != 0 {
		t.Errorf("%s: checks failed other than shed: %v", name, c)
	}
	// A shed check may have spent at the store all the same (its reply came
	// too late to be read; node.ErrOverloaded): each one shed may stand
	// for a unit counted but not seen admitted, never for one admitted
	// over the limit.
	if a := c.allowed.Load(); a > legitLimit || a < legitLimit-c.shed.Load() {
		t.Errorf("%s: admitted %d times, want its limit %d (less at most the %d shed)", name, a, legitLimit, c.shed.Load())
	}
}

// A flood of all-or-nothing batches from one client: 8 callers, each
// sending 1000-item batches of cost-0 checks of fresh keys, back to back,
// to one node on a healthy Redis. The node bounds the goroutines a batch
// fans out to, and sheds what it cannot do in time with an error: no item
// and no other client's check is answered by a failure mode, the breaker
// never opens, and a legitimate key of 100 a minute is admitted exactly
// 100 times whichever way its policy fails.
func TestAllOrNothingFloodNeverTakesTheFailureMode(t *testing.T) {
	r := redistest.Start(t, redistest.OwnMachine())
	cfg := writeFile(t, "q.yaml", overloadConfig)
	p := startProcess(t, "--config", cfg, "--redis", r.URL())
	quotadtest.AwayFromWindowEnd(t, time.Minute, 20*time.Second)

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	client := quotadv1connect.NewQuotaServiceClient(hc, p.URL)
	ctx := context.Background()
	// The node's goroutines before the flood, connections to it open.
	if _, err := client.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "flood", Key: "warm"})); err != nil {
		t.Fatal(err)
	}
	base := goroutines(t, p.URL)
	watch := watchProcess(t, p.URL)

	const callers, items = 8, 1000
	floodFor := 3 * time.Second
	if quotadtest.Race() {
		floodFor = 5 * time.Second
	}
	var batches, shed, batchErrs, floodFailOpen, floodItems atomic.Int64
	var lastBatchErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			zero := int64(0)
			for b := 0; ; b++ {
				select {
				case <-stop:
					return
				default:
				}
				reqs := make([]*quotadv1.CheckRequest, items)
				for i := range reqs {
					reqs[i] = &quotadv1.CheckRequest{Policy: "flood", Key: fmt.Sprintf("f%d-%d-%d", c, b, i), Cost: &zero}
				}
				res, err := client.CheckBatch(ctx, connect.NewRequest(&quotadv1.CheckBatchRequest{Requests: reqs, AllOrNothing: true}))
				batches.Add(1)
				switch {
				case isShed(err):
					shed.Add(1)
					continue
				case err != nil:
					batchErrs.Add(1)
					lastBatchErr.Store(err.Error())
					continue
				}
				for _, r := range res.Msg.GetResults() {
					floodItems.Add(1)
					if r.GetResponse().GetSource() == quotadv1.Source_SOURCE_FAIL_OPEN {
						floodFailOpen.Add(1)
					}
				}
			}
		})
	}
	var open, closed legitClient
	wg.Go(func() { open.run(ctx, client, "legit-open", "user", stop) })
	wg.Go(func() { closed.run(ctx, client, "legit-closed", "user", stop) })
	time.Sleep(floodFor)
	close(stop)
	wg.Wait()
	// The limits must be reached to show they held: past the flood, the
	// legitimate client goes on until the store itself denies it.
	open.untilDenied(ctx, t, client, "legit-open", "user")
	closed.untilDenied(ctx, t, client, "legit-closed", "user")
	watch.end()

	st, err := readStatus(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	last, _ := lastBatchErr.Load().(string)
	bound := base + callers*(node.BatchParallel+perCallerGoroutines)
	t.Logf("flood: %d batches, %d shed as overloaded, %d failed otherwise (last: %q); %d items answered, %d of them fail-open",
		batches.Load(), shed.Load(), batchErrs.Load(), last, floodItems.Load(), floodFailOpen.Load())
	t.Logf("node: %d goroutines before the flood, peak %d during it (bound %d) over %d samples; breaker %s now, seen open %t, opened %d times; %d store errors",
		base, watch.peakGoroutines.Load(), bound, watch.samples.Load(), st.Store.Breaker, watch.breakerOpen.Load(), st.Store.BreakerOpens, st.Store.Errors)
	if floodFailOpen.Load() != 0 {
		t.Errorf("%d flood items answered fail-open on a healthy Redis", floodFailOpen.Load())
	}
	if batchErrs.Load() != 0 {
		t.Errorf("%d batches failed other than shed as overloaded (last: %s)", batchErrs.Load(), last)
	}
	if st.Store.BreakerOpens != 0 || watch.breakerOpen.Load() {
		t.Errorf("the breaker opened %d times on a healthy Redis", st.Store.BreakerOpens)
	}
	checkLegit(t, "legit-open", &open)
	checkLegit(t, "legit-closed", &closed)
	if peak := watch.peakGoroutines.Load(); peak > bound {
		t.Errorf("peak %d goroutines, want at most %d: %d before the flood, and per caller the batch's %d workers and %d more",
			peak, bound, base, node.BatchParallel, perCallerGoroutines)
	}
}

// perCallerGoroutines is the goroutines a node may run for one caller of
// CheckBatch beside the batch's workers: its connection's, the batch's
// own, the give-backs of late replies, with room for the node's own
// comings and goings (a scrape, a timer) in the same sample. Without a
// bound on the fan-out, the flood's peak was over 2,600.
const perCallerGoroutines = 24

// goroutines reads the node's goroutines (go_goroutines on /metrics).
func goroutines(t *testing.T, base string) int64 {
	t.Helper()
	g, ok := metricValue(scrape(t, base), "go_goroutines", nil)
	if !ok {
		t.Fatal("no go_goroutines on /metrics")
	}
	return int64(g)
}

// isShed reports whether err is a node's shedding of a check it could not
// decide in time: Unavailable, saying so.
func isShed(err error) bool {
	return connect.CodeOf(err) == connect.CodeUnavailable && strings.Contains(err.Error(), "overloaded")
}

// A node driven past its CPU, on a healthy Redis: callers send plain
// batches of checks of fresh keys back to back, while goroutines of the
// test process spin on every core. Checks the node cannot decide in time
// are shed with an error; none is answered by its failure mode, the
// breaker never opens, and a legitimate key of 100 a minute that fails
// open is admitted exactly 100 times.
func TestCPUOverloadNeverTakesTheFailureMode(t *testing.T) {
	r := redistest.Start(t, redistest.OwnMachine())
	cfg := writeFile(t, "q.yaml", overloadConfig)
	p := startProcess(t, "--config", cfg, "--redis", r.URL())
	quotadtest.AwayFromWindowEnd(t, time.Minute, 20*time.Second)
	pid := p.cmd.Process.Pid
	cpuBefore, _ := procStat(t, pid)

	// The spinners take the machine's cores; more processors than cores
	// in this process let its clients still run beside them.
	prev := runtime.GOMAXPROCS(4 * runtime.NumCPU())
	defer runtime.GOMAXPROCS(prev)
	var spinning atomic.Bool
	spinning.Store(true)
	var spinners sync.WaitGroup
	defer func() { spinning.Store(false); spinners.Wait() }()
	for range runtime.NumCPU() {
		spinners.Go(func() {
			for n := 0; spinning.Load(); n++ {
			}
		})
	}

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	client := quotadv1connect.NewQuotaServiceClient(hc, p.URL)
	ctx := context.Background()
	watch := watchProcess(t, p.URL)

	const callers, items = 8, 1000
	loadFor := 3 * time.Second
	if quotadtest.Race() {
		loadFor = 5 * time.Second
	}
	var itemsAnswered, failOpen, shed, otherErrs atomic.Int64
	var lastOther atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for b := 0; ; b++ {
				select {
				case <-stop:
					return
				default:
				}
				reqs := make([]*quotadv1.CheckRequest, items)
				for i := range reqs {
					reqs[i] = &quotadv1.CheckRequest{Policy: "flood", Key: fmt.Sprintf("c%d-%d-%d", c, b, i)}
				}
				res, err := client.CheckBatch(ctx, connect.NewRequest(&quotadv1.CheckBatchRequest{Requests: reqs}))
				if err != nil {
					otherErrs.Add(1)
					lastOther.Store(err.Error())
					continue
				}
				for _, r := range res.Msg.GetResults() {
					switch e := r.GetError(); {
					case e == nil:
						itemsAnswered.Add(1)
						if r.GetResponse().GetSource() == quotadv1.Source_SOURCE_FAIL_OPEN {
							failOpen.Add(1)
						}
					case e.GetCode() == connect.CodeUnavailable.String() && strings.Contains(e.GetMessage(), "overloaded"):
						shed.Add(1)
					default:
						otherErrs.Add(1)
						lastOther.Store(e.GetCode() + ": " + e.GetMessage())
					}
				}
			}
		})
	}
	var open legitClient
	legitDone := make(chan struct{})
	go func() {
		defer close(legitDone)
		open.run(ctx, client, "legit-open", "user", stop)
	}()
	time.Sleep(loadFor)
	close(stop)
	wg.Wait()
	<-legitDone
	spinning.Store(false)
	spinners.Wait()
	// The limit must be reached to show it held: past the overload, the
	// legitimate client goes on until the store itself denies it.
	open.untilDenied(ctx, t, client, "legit-open", "user")
	watch.end()
	cpuAfter, _ := procStat(t, pid)

	st, err := readStatus(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	last, _ := lastOther.Load().(string)
	t.Logf("load: %d items answered (%d fail-open), %d shed as overloaded, %d other errors (last: %q); node CPU %s in %s",
		itemsAnswered.Load(), failOpen.Load(), shed.Load(), otherErrs.Load(), last, (cpuAfter - cpuBefore).Round(time.Millisecond), loadFor)
	t.Logf("node: peak %d goroutines; breaker %s now, seen open %t, opened %d times; %d store errors",
		watch.peakGoroutines.Load(), st.Store.Breaker, watch.breakerOpen.Load(), st.Store.BreakerOpens, st.Store.Errors)
	if failOpen.Load() != 0 {
		t.Errorf("%d items answered fail-open on a healthy Redis", failOpen.Load())
	}
	if otherErrs.Load() != 0 {
		t.Errorf("%d errors other than overload (last: %s)", otherErrs.Load(), last)
	}
	if st.Store.BreakerOpens != 0 || watch.breakerOpen.Load() {
		t.Errorf("the breaker opened %d times on a healthy Redis", st.Store.BreakerOpens)
	}
	checkLegit(t, "legit-open", &open)
}
