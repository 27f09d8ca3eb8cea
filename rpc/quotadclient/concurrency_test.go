package quotadclient_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// twoJobs is the tests' configured concurrency policy: 2 slots living a
// minute.
var twoJobs = node.Policy{Name: "jobs", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 2, Period: time.Minute}}

// byTenant keys requests by the X-Tenant header.
var byTenant = quotadclient.KeyByHeader("X-Tenant")

// gate is a handler that signals each request's arrival on entered and
// holds it until the test sends on proceed (or the request's context ends,
// with waitForClient), then answers "done", or panics with panics.
type gate struct {
	entered       chan struct{}
	proceed       chan struct{}
	waitForClient bool
	panics        bool
}

func newGate() *gate {
	return &gate{entered: make(chan struct{}, 100), proceed: make(chan struct{}, 100)}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.entered <- struct{}{}
	if g.waitForClient {
		<-r.Context().Done()
		return
	}
	<-g.proceed
	if g.panics {
		panic("handler failed")
	}
	_, _ = w.Write([]byte("done\n"))
}

// wait waits for n requests to enter.
func (g *gate) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-g.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("no request reached the handler within 10s")
		}
	}
}

// serveConcurrency serves g behind a ConcurrencyMiddleware built from cfg.
func serveConcurrency(t *testing.T, c *quotadclient.Client, cfg quotadclient.ConcurrencyConfig, h http.Handler) string {
	t.Helper()
	mw, err := quotadclient.ConcurrencyMiddleware(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	return srv.URL
}

// freeSlots asks quotad (cost 0) how many slots of policy (or of an inline
// limit) are free for key.
func freeSlots(t *testing.T, c *quotadclient.Client, policy string, limit *algorithms.Limit, key string) int64 {
	t.Helper()
	var d quotadclient.Decision
	var err error
	if limit != nil {
		d, err = c.CheckLimit(context.Background(), policy, *limit, key, 0)
	} else {
		d, err = c.Check(context.Background(), policy, key, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// waitFree waits until want slots are free.
func waitFree(t *testing.T, c *quotadclient.Client, policy string, limit *algorithms.Limit, key string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := freeSlots(t, c, policy, limit, key)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slots free after 10s, want %d", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Two requests in flight take both slots; a third is 429 with the
// concurrent-requests headers and Retry-After: 1; a request that ends
// frees its slot for the next.
func TestConcurrencyMiddleware(t *testing.T) {
	c := newClient(t, startQuotad(t, nil, rpc.Config{}, twoJobs), quotadclient.ProtocolConnect)
	g := newGate()
	url := serveConcurrency(t, c, quotadclient.ConcurrencyConfig{Policy: "jobs", Key: byTenant}, g)
	var wg sync.WaitGroup
	replies := make(chan reply, 3)
	send := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := fetch(url, "X-Tenant", "t1")
			if err != nil {
				t.Error(err)
			}
			replies <- r
		}()
	}
	send()
	send()
	g.wait(t, 2)
	if free := freeSlots(t, c, "jobs", nil, "t1"); free != 0 {
		t.Fatalf("%d slots free with two requests in flight", free)
	}
	r := get(t, url, "X-Tenant", "t1")
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" ||
		r.header.Get("RateLimit-Policy") != `"jobs";q=2;qu="concurrent-requests"` || r.header.Get("RateLimit") != `"jobs";r=0` {
		t.Fatalf("third request: %d %v %q", r.status, r.header, r.body)
	}
	g.proceed <- struct{}{}
	if r := <-replies; r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("RateLimit"), `"jobs";r=`) {
		t.Fatalf("first request to end: %d %v", r.status, r.header)
	}
	waitFree(t, c, "jobs", nil, "t1", 1)
	send()
	g.wait(t, 1)
	g.proceed <- struct{}{}
	g.proceed <- struct{}{}
	wg.Wait()
	waitFree(t, c, "jobs", nil, "t1", 2)
}

// A handler that panics, and one whose client goes away, release their
// slots.
func TestConcurrencyMiddlewareReleasesOnPanicAndDisconnect(t *testing.T) {
	c := newClient(t, startQuotad(t, nil, rpc.Config{}, twoJobs), quotadclient.ProtocolConnect)
	t.Run("panic", func(t *testing.T) {
		g := newGate()
		g.panics = true
		url := serveConcurrency(t, c, quotadclient.ConcurrencyConfig{Policy: "jobs", Key: byTenant}, g)
		done := make(chan error, 1)
		go func() {
			_, err := fetch(url, "X-Tenant", "panic")
			done <- err
		}()
		g.wait(t, 1)
		if free := freeSlots(t, c, "jobs", nil, "panic"); free != 1 {
			t.Fatalf("%d slots free while the handler runs", free)
		}
		g.proceed <- struct{}{}
		if err := <-done; err == nil {
			t.Error("the panicking handler's response arrived whole")
		}
		waitFree(t, c, "jobs", nil, "panic", 2)
	})
	t.Run("client disconnect", func(t *testing.T) {
		g := newGate()
		g.waitForClient = true
		url := serveConcurrency(t, c, quotadclient.ConcurrencyConfig{Policy: "jobs", Key: byTenant}, g)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("X-Tenant", "gone")
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		g.wait(t, 1)
		if free := freeSlots(t, c, "jobs", nil, "gone"); free != 1 {
			t.Fatalf("%d slots free while the handler runs", free)
		}
		cancel()
		<-done
		waitFree(t, c, "jobs", nil, "gone", 2)
	})
}

// countRenews serves a real quotad (memory store) and counts the RenewSlot
// calls it answers.
func countRenews(t *testing.T, policies ...node.Policy) (string, *atomic.Int64) {
	t.Helper()
	n, err := node.New(node.Config{Policies: policies}, memory.New(nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h, err := rpc.NewHandler(n, rpc.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	renews := &atomic.Int64{}
	url := serveH2C(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/RenewSlot") {
			renews.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	return url, renews
}

// syncLog is a slog destination the test can read while handlers write.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A request that runs for several periods keeps its slot: the middleware
// renews it every third of a period.
func TestConcurrencyMiddlewareRenewsLongRequests(t *testing.T) {
	url, renews := countRenews(t)
	c := newClient(t, url, quotadclient.ProtocolConnect)
	oneSecond := &algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1, Period: time.Second}
	log := &syncLog{}
	g := newGate()
	app := serveConcurrency(t, c, quotadclient.ConcurrencyConfig{Policy: "long", Limit: oneSecond, Key: byTenant, Log: slog.New(slog.NewTextHandler(log, nil))}, g)
	start := time.Now()
	done := make(chan reply, 1)
	go func() {
		r, _ := fetch(app, "X-Tenant", "t")
		done <- r
	}()
	g.wait(t, 1)
	// Six renews are two periods: the slot would have expired twice over.
	for renews.Load() < 6 {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("%d renews in 20s", renews.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if free := freeSlots(t, c, "long", oneSecond, "t"); free != 0 {
		t.Fatalf("%s into the request (%d renews), its slot is free", time.Since(start), renews.Load())
	}
	t.Logf("still held %s after it was taken, period 1s, %d renews", time.Since(start).Round(time.Millisecond), renews.Load())
	g.proceed <- struct{}{}
	if r := <-done; r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	waitFree(t, c, "long", oneSecond, "t", 1)
	if s := log.String(); s != "" {
		t.Errorf("warnings: %s", s)
	}
}

// A slot that is gone (reset here; in life, renews failing for a period)
// is logged once, then neither renewed nor released.
func TestConcurrencyMiddlewareLostSlot(t *testing.T) {
	url, renews := countRenews(t)
	c := newClient(t, url, quotadclient.ProtocolConnect)
	limit := &algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1, Period: time.Minute}
	lines := make(logLines, 10)
	g := newGate()
	app := serveConcurrency(t, c, quotadclient.ConcurrencyConfig{Policy: "lost", Limit: limit, Key: byTenant, RenewEvery: 20 * time.Millisecond, Log: lines.logger()}, g)
	done := make(chan reply, 1)
	go func() {
		r, _ := fetch(app, "X-Tenant", "t")
		done <- r
	}()
	g.wait(t, 1)
	if _, err := c.Service().Reset(context.Background(), connect.NewRequest(&quotadv1.ResetRequest{Policy: "lost", Key: "t"})); err != nil {
		t.Fatal(err)
	}
	if line := lines.next(t); !strings.Contains(line, "quotad slot lost") || !strings.Contains(line, "not_found") && !strings.Contains(line, "slot not held") {
		t.Fatalf("logged %q", line)
	}
	after := renews.Load()
	g.proceed <- struct{}{}
	if r := <-done; r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	if renews.Load() != after {
		t.Errorf("renewed after the slot was lost")
	}
	select {
	case line := <-lines:
		t.Errorf("logged again: %q", line)
	default:
	}
}

// The rate-limit Middleware on a concurrency policy holds the slot while
// the handler runs too, instead of leaving it taken for a period.
func TestMiddlewareHoldsConcurrencySlots(t *testing.T) {
	c := newClient(t, startQuotad(t, nil, rpc.Config{}, twoJobs), quotadclient.ProtocolConnect)
	mw, err := quotadclient.Middleware(c, quotadclient.MiddlewareConfig{Policy: "jobs", Key: byTenant})
	if err != nil {
		t.Fatal(err)
	}
	g := newGate()
	srv := httptest.NewServer(mw(g))
	t.Cleanup(srv.Close)
	done := make(chan reply, 1)
	go func() {
		r, _ := fetch(srv.URL, "X-Tenant", "t")
		done <- r
	}()
	g.wait(t, 1)
	if free := freeSlots(t, c, "jobs", nil, "t"); free != 1 {
		t.Fatalf("%d slots free while the handler runs", free)
	}
	g.proceed <- struct{}{}
	<-done
	waitFree(t, c, "jobs", nil, "t", 2)
}

func TestConcurrencyConfigValidation(t *testing.T) {
	c := newClient(t, closedURL(t), quotadclient.ProtocolConnect)
	for name, cfg := range map[string]quotadclient.ConcurrencyConfig{
		"no policy":       {Key: byTenant},
		"no key":          {Policy: "jobs"},
		"a rate limit":    {Policy: "jobs", Key: byTenant, Limit: &algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1, Period: time.Second}},
		"negative renew":  {Policy: "jobs", Key: byTenant, RenewEvery: -time.Second},
		"negative timout": {Policy: "jobs", Key: byTenant, Timeout: -time.Second},
	} {
		if _, err := quotadclient.ConcurrencyMiddleware(c, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := quotadclient.ConcurrencyMiddleware(nil, quotadclient.ConcurrencyConfig{Policy: "jobs", Key: byTenant}); err == nil {
		t.Error("no client: accepted")
	}
}

// Release twice: the second is NotFound and frees nothing.
func TestReleaseTwiceIsAnError(t *testing.T) {
	r := redistest.Start(t)
	c := newClient(t, startQuotad(t, r, rpc.Config{}, twoJobs), quotadclient.ProtocolGRPC)
	ctx := context.Background()
	a, err := c.Check(ctx, "jobs", "k", 1)
	if err != nil || !a.Allowed || a.Slot == "" || a.SlotExpiresAfter != time.Minute {
		t.Fatalf("check: %+v, %v", a, err)
	}
	ref := quotadclient.SlotRef{Policy: "jobs", Key: "k", ID: a.Slot}
	if d, err := c.ReleaseSlot(ctx, ref); err != nil || d.Remaining != 2 {
		t.Fatalf("release: %+v, %v", d, err)
	}
	b, _ := c.Check(ctx, "jobs", "k", 1)
	_, err = c.ReleaseSlot(ctx, ref)
	if connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "slot not held") {
		t.Fatalf("second release: %v, want NotFound", err)
	}
	// It freed nothing: b's slot is still held.
	if free := freeSlots(t, c, "jobs", nil, "k"); free != 1 || !b.Allowed {
		t.Fatalf("%d slots free after the second release, want 1 (b %+v)", free, b)
	}
	if _, err := c.RenewSlot(ctx, ref); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("renew of the released slot: %v", err)
	}
}
