package quotadclient_test

import (
	"context"
	"io"
	stdlog "log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// app is an httptest server whose handler counts the requests that reach
// it, wrapped in a quotad middleware built from cfg.
type app struct {
	URL     string
	reached atomic.Int64
}

func startApp(t *testing.T, c *quotadclient.Client, cfg quotadclient.MiddlewareConfig) *app {
	t.Helper()
	mw, err := quotadclient.Middleware(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &app{}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		a.reached.Add(1)
		_, _ = io.WriteString(w, "hello\n")
	})))
	t.Cleanup(srv.Close)
	a.URL = srv.URL
	return a
}

type reply struct {
	status int
	header http.Header
	body   string
}

// get sends GET url with the given header pairs.
func get(t *testing.T, url string, headers ...string) reply {
	t.Helper()
	r, err := fetch(url, headers...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fetch is get for goroutines other than the test's, which must not call
// t.Fatal.
func fetch(url string, headers ...string) (reply, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(body)}, err
}

var (
	policyRE = regexp.MustCompile(`^"([^"]+)";q=(\d+)(?:;w=(\d+))?$`)
	limitRE  = regexp.MustCompile(`^"([^"]+)";r=(\d+);t=(\d+)$`)
)

// rateLimit parses the response's single RateLimit-Policy and RateLimit
// items, failing the test if either is missing or malformed.
func rateLimit(t *testing.T, h http.Header) (policy string, q, w, r, tt int64) {
	t.Helper()
	pm := policyRE.FindStringSubmatch(h.Get("RateLimit-Policy"))
	lm := limitRE.FindStringSubmatch(h.Get("RateLimit"))
	if pm == nil || lm == nil || len(h.Values("RateLimit")) != 1 {
		t.Fatalf("RateLimit-Policy %q, RateLimit %q: want one item each as in draft-ietf-httpapi-ratelimit-headers", h.Values("RateLimit-Policy"), h.Values("RateLimit"))
	}
	if pm[1] != lm[1] {
		t.Fatalf("RateLimit-Policy names %q, RateLimit %q", pm[1], lm[1])
	}
	n := func(s string) int64 {
		v, _ := strconv.ParseInt(s, 10, 64) // "" (no w) is 0
		return v
	}
	return pm[1], n(pm[2]), n(pm[3]), n(lm[2]), n(lm[3])
}

// An httptest server wrapped in the middleware
// answers 200 with RateLimit headers, then 429 with Retry-After, against a
// real quotad on the memory store and on Redis, over each protocol.
func TestMiddlewareAllowsThenDenies(t *testing.T) {
	type setup struct {
		redis    bool
		protocol quotadclient.Protocol
	}
	setups := map[string]setup{
		"memory/connect": {false, quotadclient.ProtocolConnect},
		"memory/grpc":    {false, quotadclient.ProtocolGRPC},
		"memory/grpcweb": {false, quotadclient.ProtocolGRPCWeb},
		"redis/connect":  {true, quotadclient.ProtocolConnect},
	}
	for name, s := range setups {
		t.Run(name, func(t *testing.T) {
			var r *redistest.Server
			if s.redis {
				r = redistest.Start(t)
			}
			c := newClient(t, startQuotad(t, r, rpc.Config{}, threeAMinute), s.protocol)
			a := startApp(t, c, quotadclient.MiddlewareConfig{Policy: "api", Key: quotadclient.KeyByHeader("X-API-Key")})
			for i := range 3 {
				got := get(t, a.URL, "X-API-Key", "alice")
				if got.status != http.StatusOK || got.body != "hello\n" {
					t.Fatalf("request %d: %d %q, want 200 from the handler", i+1, got.status, got.body)
				}
				policy, q, w, r, tt := rateLimit(t, got.header)
				// w is the configured policy's period, which the middleware
				// learnt from quotad.
				if policy != "api" || q != 3 || w != 60 || r != int64(2-i) || tt < 1 || tt > 60 {
					t.Fatalf("request %d: policy %q q=%d w=%d r=%d t=%d, want \"api\" q=3 w=60 r=%d t in [1,60]", i+1, policy, q, w, r, tt, 2-i)
				}
				if got.header.Get("Retry-After") != "" {
					t.Fatalf("request %d: Retry-After on an allowed request", i+1)
				}
			}
			got := get(t, a.URL, "X-API-Key", "alice")
			if got.status != http.StatusTooManyRequests || !strings.Contains(got.body, "rate limit exceeded") {
				t.Fatalf("fourth request: %d %q, want 429", got.status, got.body)
			}
			retry, err := strconv.Atoi(got.header.Get("Retry-After"))
			if err != nil || retry < 1 || retry > 60 {
				t.Fatalf("Retry-After %q, want whole seconds in [1,60]", got.header.Get("Retry-After"))
			}
			if _, _, _, r, tt := rateLimit(t, got.header); r != 0 || tt > int64(retry) {
				t.Fatalf("denied: r=%d t=%d with Retry-After %d, want r=0 and t ≤ Retry-After", r, tt, retry)
			}
			if n := a.reached.Load(); n != 3 {
				t.Fatalf("handler reached %d times, want 3 (the denied request must not reach it)", n)
			}
			// Another key has its own quota.
			if got := get(t, a.URL, "X-API-Key", "bob"); got.status != http.StatusOK {
				t.Fatalf("another key: %d, want 200", got.status)
			}
		})
	}
}

// quotad unreachable or too slow: FailOpen serves without RateLimit
// headers and logs, FailClosed answers 503; neither waits past Timeout.
func TestMiddlewareWithoutQuotad(t *testing.T) {
	targets := map[string]string{"refused": closedURL(t), "hanging": hangingURL(t)}
	for name, url := range targets {
		for _, mode := range []quotadclient.ErrorMode{quotadclient.FailOpen, quotadclient.FailClosed} {
			t.Run(name+"/"+mode.String(), func(t *testing.T) {
				log := make(logLines, 16)
				a := startApp(t, newClient(t, url, quotadclient.ProtocolConnect), quotadclient.MiddlewareConfig{
					Policy: "api", Key: quotadclient.KeyByIP(), OnError: mode, Timeout: 100 * time.Millisecond, Log: log.logger(),
				})
				got := get(t, a.URL)
				if got.header.Get("RateLimit") != "" || got.header.Get("RateLimit-Policy") != "" {
					t.Errorf("RateLimit headers %q without a decision", got.header)
				}
				switch mode {
				case quotadclient.FailOpen:
					if got.status != http.StatusOK || a.reached.Load() != 1 {
						t.Fatalf("fail open: %d, handler reached %d times; want 200 from the handler", got.status, a.reached.Load())
					}
				case quotadclient.FailClosed:
					if got.status != http.StatusServiceUnavailable || a.reached.Load() != 0 {
						t.Fatalf("fail closed: %d, handler reached %d times; want 503 without the handler", got.status, a.reached.Load())
					}
				}
				wantCode := map[string]string{"refused": "code=unavailable", "hanging": "code=deadline_exceeded"}[name]
				if l := log.next(t); !strings.Contains(l, "quotad check failed") || !strings.Contains(l, wantCode) || !strings.Contains(l, "on_error="+mode.String()) {
					t.Fatalf("log %q lacks the failure with %s", l, wantCode)
				}
			})
		}
	}
}

// Without a Log, a check that fails open still warns, on slog's default
// logger: a limiter that lets everything through must not do it silently.
func TestMiddlewareWithoutLogWarnsOnTheDefaultLogger(t *testing.T) {
	log := make(logLines, 16)
	// SetDefault also sends the log package's output to the new handler;
	// all three are put back.
	prev, prevOut, prevFlags := slog.Default(), stdlog.Writer(), stdlog.Flags()
	defer func() {
		slog.SetDefault(prev)
		stdlog.SetOutput(prevOut)
		stdlog.SetFlags(prevFlags)
	}()
	slog.SetDefault(log.logger())
	a := startApp(t, newClient(t, closedURL(t), quotadclient.ProtocolConnect), quotadclient.MiddlewareConfig{
		Policy: "api", Key: quotadclient.KeyByIP(), Timeout: 100 * time.Millisecond,
	})
	if got := get(t, a.URL); got.status != http.StatusOK {
		t.Fatalf("fail open: %d, want 200", got.status)
	}
	if l := log.next(t); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "quotad check failed") || !strings.Contains(l, "on_error=open") {
		t.Fatalf("default logger got %q, want the fail-open warning", l)
	}
}

// When Redis fails, quotad's own failure mode decides, and the middleware
// passes a fail-closed denial on as a 429 like any other.
func TestMiddlewarePassesOnQuotadsFailClosedDenial(t *testing.T) {
	r := redistest.Start(t)
	closed := threeAMinute
	closed.OnStoreError = node.FailClosed
	c := newClient(t, startQuotad(t, r, rpc.Config{}, closed), quotadclient.ProtocolConnect)
	// The middleware waits longer than the test store's Redis deadline
	// (500ms), so that quotad's failure-mode answer arrives first.
	a := startApp(t, c, quotadclient.MiddlewareConfig{Policy: "api", Key: quotadclient.KeyByHeader("X-API-Key"), Timeout: 5 * time.Second})
	if got := get(t, a.URL, "X-API-Key", "k"); got.status != http.StatusOK {
		t.Fatalf("with Redis up: %d", got.status)
	}
	r.Kill()
	d, err := c.Check(context.Background(), "api", "k2", 1)
	if err != nil || d.Allowed || d.Source != quotadclient.SourceFailClosed {
		t.Fatalf("check with Redis down: %+v, %v; want a fail_closed denial", d, err)
	}
	got := get(t, a.URL, "X-API-Key", "k")
	if got.status != http.StatusTooManyRequests || got.header.Get("Retry-After") != "60" {
		t.Fatalf("with Redis down: %d, Retry-After %q; want 429 with the policy's period, 60", got.status, got.header.Get("Retry-After"))
	}
	if a.reached.Load() != 1 {
		t.Fatalf("handler reached %d times, want 1", a.reached.Load())
	}
}

// Requests without a usable key or cost answer 400, whatever OnError says:
// an oversized key must not slip past a failing-open limiter.
func TestMiddlewareRejectsUnusableKeysAndCosts(t *testing.T) {
	c := newClient(t, startQuotad(t, nil, rpc.Config{}, threeAMinute), quotadclient.ProtocolConnect)
	cost := func(r *http.Request) (int64, error) {
		if v := r.Header.Get("X-Cost"); v != "" {
			return strconv.ParseInt(v, 10, 64)
		}
		return 1, nil
	}
	a := startApp(t, c, quotadclient.MiddlewareConfig{Policy: "api", Key: quotadclient.KeyByHeader("X-API-Key"), Cost: cost, OnError: quotadclient.FailOpen})
	cases := []struct {
		name    string
		headers []string
		want    string
	}{
		{"missing header", nil, "X-Api-Key is missing"},
		{"key over 1 KiB", []string{"X-API-Key", strings.Repeat("k", 1025)}, "key"},
		{"cost not a number", []string{"X-API-Key", "k", "X-Cost", "two"}, "rate limit cost"},
		{"negative cost", []string{"X-API-Key", "k", "X-Cost", "-1"}, "cost"},
		{"cost above the capacity", []string{"X-API-Key", "k", "X-Cost", "4"}, "cost"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := get(t, a.URL, tc.headers...)
			if got.status != http.StatusBadRequest || !strings.Contains(got.body, tc.want) {
				t.Fatalf("%d %q, want 400 mentioning %q", got.status, got.body, tc.want)
			}
		})
	}
	if n := a.reached.Load(); n != 0 {
		t.Fatalf("handler reached %d times, want 0", n)
	}
}

// Cost 0 makes a request free: it passes with the headers even when the
// quota is spent, and spends nothing.
func TestMiddlewareCostZeroIsFree(t *testing.T) {
	c := newClient(t, startQuotad(t, nil, rpc.Config{}, threeAMinute), quotadclient.ProtocolConnect)
	free := func(r *http.Request) (int64, error) {
		if r.URL.Path == "/quota" {
			return 0, nil
		}
		return 1, nil
	}
	a := startApp(t, c, quotadclient.MiddlewareConfig{Policy: "api", Key: quotadclient.KeyByIP(), Cost: free})
	if got := get(t, a.URL+"/quota"); got.status != http.StatusOK {
		t.Fatalf("free request: %d", got.status)
	} else if _, _, _, r, _ := rateLimit(t, got.header); r != 3 {
		t.Fatalf("free request reports r=%d, want 3 (nothing spent)", r)
	}
	for range 3 {
		get(t, a.URL+"/work")
	}
	if got := get(t, a.URL+"/work"); got.status != http.StatusTooManyRequests {
		t.Fatalf("fourth paid request: %d, want 429", got.status)
	}
	got := get(t, a.URL+"/quota")
	if got.status != http.StatusOK || got.header.Get("Retry-After") != "" {
		t.Fatalf("free request after the limit: %d, Retry-After %q; want 200 without", got.status, got.header.Get("Retry-After"))
	}
	if _, _, _, r, _ := rateLimit(t, got.header); r != 0 {
		t.Fatalf("free request after the limit reports r=%d, want 0", r)
	}
}

// The window w comes from an inline limit's period, from Window, or is left
// out when it is not whole seconds or quotad does not list the policy.
func TestMiddlewareWindow(t *testing.T) {
	odd := node.Policy{Name: "odd", Limit: algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 10, Period: 1500 * time.Millisecond}}
	c := newClient(t, startQuotad(t, nil, rpc.Config{}, threeAMinute, odd), quotadclient.ProtocolConnect)
	inline := algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 7, Period: 10 * time.Second}
	cases := []struct {
		name  string
		cfg   quotadclient.MiddlewareConfig
		q, w  int64
		wantW bool
	}{
		{"inline limit", quotadclient.MiddlewareConfig{Policy: "inline", Limit: &inline}, 7, 10, true},
		{"explicit window", quotadclient.MiddlewareConfig{Policy: "api", Window: 90 * time.Second}, 3, 90, true},
		{"fractional period", quotadclient.MiddlewareConfig{Policy: "odd"}, 10, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Key = quotadclient.KeyByIP()
			got := get(t, startApp(t, c, tc.cfg).URL)
			if got.status != http.StatusOK {
				t.Fatalf("status %d", got.status)
			}
			_, q, w, _, _ := rateLimit(t, got.header)
			if q != tc.q || w != tc.w || strings.Contains(got.header.Get("RateLimit-Policy"), ";w=") != tc.wantW {
				t.Fatalf("RateLimit-Policy %q, want q=%d and w=%d", got.header.Get("RateLimit-Policy"), tc.q, tc.w)
			}
		})
	}
}

// Chained middlewares each add their item to the two list fields.
func TestMiddlewaresChain(t *testing.T) {
	c := newClient(t, startQuotad(t, nil, rpc.Config{}, threeAMinute), quotadclient.ProtocolConnect)
	perRoute, err := quotadclient.Middleware(c, quotadclient.MiddlewareConfig{
		Policy: "routes", Key: quotadclient.KeyByRoute(nil),
		Limit: &algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 100, Period: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	perUser, err := quotadclient.Middleware(c, quotadclient.MiddlewareConfig{Policy: "api", Key: quotadclient.KeyByIP()})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", perRoute(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	srv := httptest.NewServer(perUser(mux))
	t.Cleanup(srv.Close)
	got := get(t, srv.URL+"/items/7")
	if got.status != http.StatusOK {
		t.Fatalf("status %d", got.status)
	}
	if p := got.header.Values("RateLimit-Policy"); len(p) != 2 || p[0] != `"api";q=3;w=60` || p[1] != `"routes";q=100;w=1` {
		t.Fatalf("RateLimit-Policy %q, want the per-user then the per-route item", p)
	}
	if l := got.header.Values("RateLimit"); len(l) != 2 || !strings.HasPrefix(l[0], `"api";r=2;`) || !strings.HasPrefix(l[1], `"routes";r=99;`) {
		t.Fatalf("RateLimit %q", l)
	}
}

func TestMiddlewareRejectsBadConfig(t *testing.T) {
	c := newClient(t, closedURL(t), quotadclient.ProtocolConnect)
	key := quotadclient.KeyByIP()
	for name, cfg := range map[string]quotadclient.MiddlewareConfig{
		"no policy":         {Key: key},
		"no key":            {Policy: "api"},
		"bad on error":      {Policy: "api", Key: key, OnError: 5},
		"negative timeout":  {Policy: "api", Key: key, Timeout: -time.Second},
		"fractional window": {Policy: "api", Key: key, Window: 1500 * time.Millisecond},
		"invalid limit":     {Policy: "api", Key: key, Limit: &algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 0, Period: time.Second}},
	} {
		if _, err := quotadclient.Middleware(c, cfg); err == nil {
			t.Errorf("%s: Middleware accepted %+v", name, cfg)
		}
	}
	if _, err := quotadclient.Middleware(nil, quotadclient.MiddlewareConfig{Policy: "api", Key: key}); err == nil {
		t.Error("Middleware accepted a nil client")
	}
}

// Concurrent requests through one middleware: the memory store admits
// exactly the limit, every decided response carries the headers, and the
// window lookup that the first requests race for settles on w=60.
func TestMiddlewareUnderConcurrency(t *testing.T) {
	fifty := node.Policy{Name: "fifty", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 50, Period: time.Minute}}
	c := newClient(t, startQuotad(t, nil, rpc.Config{}, fifty), quotadclient.ProtocolConnect)
	a := startApp(t, c, quotadclient.MiddlewareConfig{Policy: "fifty", Key: quotadclient.KeyByHeader("X-API-Key"), Timeout: 5 * time.Second})
	const workers, each = 8, 10
	statuses := make(chan int, workers*each)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				got, err := fetch(a.URL, "X-API-Key", "shared")
				if err != nil {
					t.Error(err)
					return
				}
				if got.header.Get("RateLimit") == "" {
					t.Errorf("status %d without RateLimit", got.status)
				}
				statuses <- got.status
			}
		})
	}
	wg.Wait()
	close(statuses)
	counts := map[int]int{}
	for s := range statuses {
		counts[s]++
	}
	if counts[http.StatusOK] != 50 || counts[http.StatusTooManyRequests] != workers*each-50 {
		t.Fatalf("statuses %v, want 50 × 200 and %d × 429", counts, workers*each-50)
	}
	if n := a.reached.Load(); n != 50 {
		t.Fatalf("handler reached %d times, want 50", n)
	}
	if _, q, w, r, _ := rateLimit(t, get(t, a.URL, "X-API-Key", "shared").header); q != 50 || w != 60 || r != 0 {
		t.Fatalf("afterwards: q=%d w=%d r=%d, want q=50 w=60 r=0", q, w, r)
	}
}
