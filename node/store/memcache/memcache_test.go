package memcache

import (
	"context"
	"crypto/tls"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/memcachedtest"
	"github.com/quotad/quotad/internal/testpki"
	"github.com/quotad/quotad/node"
)

// A window start well inside an hour's window, so that no test crosses
// its end; the clock stands still unless a test moves it.
var windowStart = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

type clock struct{ ms atomic.Int64 }

func newClock(t time.Time) *clock { c := &clock{}; c.ms.Store(t.UnixMilli()); return c }

func (c *clock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *clock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
func hourly(limit int64) algorithms.Limit {
	return algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: limit, Period: time.Hour}
}

// open is a store on srv with a call timeout a loaded machine meets.
func open(t *testing.T, srv *memcachedtest.Server, c *clock) *Store {
	t.Helper()
	s, err := New(context.Background(), Config{Addrs: []string{srv.Addr()}, Timeout: 2 * time.Second, MaxIdleConns: 8, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// counted is the window's counter as memcached holds it (0 when none).
func counted(t *testing.T, srv *memcachedtest.Server, base string, l algorithms.Limit, c *clock) int64 {
	t.Helper()
	now := c.now().UnixMilli()
	p := l.PeriodMillis()
	v, ok, err := srv.Get(windowKey(base, now-now%p))
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		t.Fatalf("counter %q: %v", v, err)
	}
	return n
}

func acquire(t *testing.T, s *Store, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant) {
	t.Helper()
	if r.Want == 0 {
		r.Want = r.Cost
	}
	d, g, err := s.Acquire(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return d, g
}

func TestDeniedPlainCheckIsNotCountedAndChargeIs(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart.Add(10 * time.Minute))
	s := open(t, srv, c)
	l := hourly(3)
	const base = "{quotad:p:k}"
	for i := range 3 {
		if d, _ := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1}); !d.Allowed || d.Remaining != int64(2-i) {
			t.Fatalf("check %d: %+v, want allowed with %d remaining", i+1, d, 2-i)
		}
	}
	d, _ := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1})
	if d.Allowed || d.RetryAfter != 50*time.Minute {
		t.Fatalf("4th check: %+v, want denied until the window's end, 50m", d)
	}
	if n := counted(t, srv, base, l, c); n != 3 {
		t.Fatalf("counter %d after a denied plain check, want 3: a denial is given back", n)
	}
	d, _ = acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 2, Charge: true})
	if d.Allowed || d.Remaining != 0 {
		t.Fatalf("charge: %+v, want denied with nothing remaining", d)
	}
	if n := counted(t, srv, base, l, c); n != 5 {
		t.Fatalf("counter %d after a charge of 2 over the limit, want 5: a charge stays counted", n)
	}
	// A cost of 0 looks without counting.
	if d, _ := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 0}); d.Allowed || d.Remaining != 0 {
		t.Fatalf("cost 0: %+v, want denied", d)
	}
	if n := counted(t, srv, base, l, c); n != 5 {
		t.Fatalf("counter %d after a cost of 0, want 5", n)
	}
}

func TestLeaseTakesWhatFitsAndGivesBackTheRest(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart.Add(59 * time.Minute))
	s := open(t, srv, c)
	l := hourly(10)
	const base = "{quotad:p:lease}"
	d, g := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1, Want: 4, Hold: time.Second})
	if !d.Allowed || g.Units != 4 || g.UseWithin != time.Minute || d.Remaining != 6 {
		t.Fatalf("first lease: %+v %+v, want 4 units for the minute left and 6 remaining", d, g)
	}
	acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 4})
	d, g2 := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1, Want: 4, Hold: time.Second})
	if !d.Allowed || g2.Units != 2 {
		t.Fatalf("second lease at 8 of 10: %+v %+v, want the 2 units that fit", d, g2)
	}
	if n := counted(t, srv, base, l, c); n != 10 {
		t.Fatalf("counter %d, want 10: the lease's 2 units that did not fit were given back", n)
	}
	back, err := s.Release(context.Background(), base, l, 3, g)
	if err != nil || back != 3 {
		t.Fatalf("release of 3: %d, %v", back, err)
	}
	if n := counted(t, srv, base, l, c); n != 7 {
		t.Fatalf("counter %d after giving back 3, want 7", n)
	}
	// Once the window has ended, its units are gone with it.
	c.advance(time.Minute)
	if back, err := s.Release(context.Background(), base, l, 1, g2); err != nil || back != 0 {
		t.Fatalf("release after the window: %d, %v; want 0", back, err)
	}
}

// Several stores, as several nodes, check one key at once: together they
// never admit more than the limit, and every denial is given back, so
// the counter ends at exactly the units admitted.
func TestConcurrentStoresNeverAdmitMoreThanTheLimit(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart.Add(time.Minute))
	l := hourly(300)
	const base = "{quotad:p:busy}"
	var admitted, errs atomic.Int64
	var wg sync.WaitGroup
	for n := range 4 {
		s := open(t, srv, c)
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 60 {
					cost := int64(1 + (n+g+i)%3)
					d, _, err := s.Acquire(context.Background(), node.AcquireRequest{Base: base, Limit: l, Cost: cost, Want: cost})
					if err != nil {
						errs.Add(1)
						continue
					}
					if d.Allowed {
						admitted.Add(cost)
					}
				}
			}()
		}
	}
	wg.Wait()
	if errs.Load() != 0 {
		t.Fatalf("%d checks failed", errs.Load())
	}
	if a := admitted.Load(); a > l.Limit || a == 0 {
		t.Fatalf("admitted %d units of a limit of %d", a, l.Limit)
	}
	if n := counted(t, srv, base, l, c); n != admitted.Load() {
		t.Fatalf("counter %d, admitted %d: every denial must be given back", n, admitted.Load())
	}
}

// Nodes with leases and remembered denials, each on a store of its own,
// share one memcached: together they admit at most the limit.
func TestConcurrentNodesNeverAdmitMoreThanTheLimit(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart.Add(time.Minute))
	p, err := node.NewPolicy(node.Policy{Name: "api", Limit: hourly(200)})
	if err != nil {
		t.Fatal(err)
	}
	var admitted, errs atomic.Int64
	var wg sync.WaitGroup
	for range 3 {
		n, err := node.New(node.Config{Policies: []node.Policy{p}}, open(t, srv, c), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 80 {
					r, err := n.Check(context.Background(), p, "tenant", 1)
					switch {
					case err != nil:
						errs.Add(1)
					case r.Source == node.SourceFailOpen || r.Source == node.SourceFailClosed:
						errs.Add(1)
					case r.Allowed:
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if errs.Load() != 0 {
		t.Fatalf("%d checks failed or took the failure mode", errs.Load())
	}
	if a := admitted.Load(); a > 200 || a == 0 {
		t.Fatalf("three nodes admitted %d of a limit of 200", a)
	}
}

// A window's counter lives until the window ends, and memcached forgets
// it soon after: the next window has a counter of its own.
func TestWindowExpiresAtItsEnd(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart.Add(time.Hour - 1500*time.Millisecond))
	s := open(t, srv, c)
	l := hourly(1)
	const base = "{quotad:p:edge}"
	acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1})
	if d, _ := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1}); d.Allowed || d.RetryAfter != 1500*time.Millisecond {
		t.Fatalf("second check: %+v, want denied for the 1.5s left", d)
	}
	key := windowKey(base, windowStart.UnixMilli())
	if _, ok, err := srv.Get(key); err != nil || !ok {
		t.Fatalf("the window's counter is not in memcached: %v", err)
	}
	c.advance(1500 * time.Millisecond)
	if d, _ := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1}); !d.Allowed {
		t.Fatalf("first check of the next window: %+v, want allowed", d)
	}
	// Its expiry was 3s (1.5s rounded up, and memcached's tick); memcached
	// reads it against its own clock, once a second.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ok, err := srv.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ended window's counter is still in memcached 10s after it was written with an expiry of 3s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestOtherAlgorithmsAreRefused(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart)
	tb := node.Policy{Name: "tb", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Second}}
	_, err := node.New(node.Config{Policies: []node.Policy{tb}}, open(t, srv, c), nil)
	if err == nil || !strings.Contains(err.Error(), "memcache keeps fixed windows only") || !strings.Contains(err.Error(), "policies[0]: policy tb") {
		t.Fatalf("a token bucket policy on memcache: %v", err)
	}
	n, err := node.New(node.Config{}, open(t, srv, c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.SetPolicies(context.Background(), []node.Policy{tb}); !errors.Is(err, node.ErrAlgorithmNotKept) {
		t.Fatalf("SetPolicies with a token bucket: %v", err)
	}
	for _, a := range []algorithms.Algorithm{algorithms.SlidingWindowLog, algorithms.Concurrency, algorithms.GCRA} {
		inline := node.Policy{Name: "inline", Limit: algorithms.Limit{Algorithm: a, Limit: 10, Period: time.Second}}
		_, err := n.Check(context.Background(), inline, "k", 1)
		if !errors.Is(err, node.ErrAlgorithmNotKept) || !node.IsInvalidInput(err) {
			t.Fatalf("an inline %s check: %v, want an input error", a, err)
		}
	}
}

func TestResetDeletesTheWindow(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart.Add(time.Minute))
	p, err := node.NewPolicy(node.Policy{Name: "api", Limit: hourly(1), Lease: node.LeaseOff})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Policies: []node.Policy{p}}, open(t, srv, c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	for i, want := range []bool{true, false} {
		if r, err := n.Check(ctx, p, "k", 1); err != nil || r.Allowed != want {
			t.Fatalf("check %d: %+v %v, want allowed %v", i+1, r, err, want)
		}
	}
	if err := n.Reset(ctx, "api", "k"); err != nil {
		t.Fatal(err)
	}
	if r, err := n.Check(ctx, p, "k", 1); err != nil || !r.Allowed {
		t.Fatalf("check after reset: %+v %v, want allowed", r, err)
	}
	// An inline namespace's limits cannot be found: said, not pretended.
	if err := n.Reset(ctx, "inline", "k"); !errors.Is(err, node.ErrResetUnsupported) {
		t.Fatalf("reset of an inline namespace: %v", err)
	}
}

// memcached down: a check takes the policy's failure mode, and the
// circuit breaker closes again once memcached is back.
func TestMemcachedDownTakesTheFailureMode(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart.Add(time.Minute))
	closed, _ := node.NewPolicy(node.Policy{Name: "closed", Limit: hourly(5), OnStoreError: node.FailClosed})
	open_, _ := node.NewPolicy(node.Policy{Name: "open", Limit: hourly(5), OnStoreError: node.FailOpen})
	s, err := New(context.Background(), Config{Addrs: []string{srv.Addr()}, Timeout: 500 * time.Millisecond, Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Policies: []node.Policy{closed, open_}}, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	if r, err := n.Check(ctx, closed, "k", 1); err != nil || !r.Allowed || r.Source != node.SourceStore {
		t.Fatalf("check with memcached up: %+v %v", r, err)
	}
	srv.Kill()
	if r, err := n.Check(ctx, closed, "k2", 1); err != nil || r.Allowed || r.Source != node.SourceFailClosed {
		t.Fatalf("fail-closed check with memcached down: %+v %v", r, err)
	}
	if r, err := n.Check(ctx, open_, "k2", 1); err != nil || !r.Allowed || r.Source != node.SourceFailOpen {
		t.Fatalf("fail-open check with memcached down: %+v %v", r, err)
	}
	srv.Restart()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := n.Check(ctx, closed, "k3", 1)
		if err == nil && r.Source == node.SourceStore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached is back, checks still answer %+v %v", r, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestLongKeysAndSpacesAreHashed(t *testing.T) {
	srv := memcachedtest.Start(t)
	c := newClock(windowStart.Add(time.Minute))
	s := open(t, srv, c)
	l := hourly(1)
	for _, base := range []string{"{quotad:p:" + strings.Repeat("k", 300) + "}", "{quotad:p:a key with spaces}"} {
		if d, _ := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1}); !d.Allowed {
			t.Fatalf("%.20s: first check denied", base)
		}
		if d, _ := acquire(t, s, node.AcquireRequest{Base: base, Limit: l, Cost: 1}); d.Allowed {
			t.Fatalf("%.20s: second check of a limit of 1 allowed", base)
		}
		if k := windowKey(base, windowStart.UnixMilli()); !strings.HasPrefix(k, "#") || len(k) != 65 {
			t.Fatalf("key %q: want '#' and a hex SHA-256", k)
		}
	}
}

func TestConfigSaysWhatToWrite(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "no server; list them as host:port,host:port"},
		{Config{Addrs: []string{"memcached"}}, `invalid memcache config: server "memcached": want host:port`},
		{Config{Addrs: []string{"memcached:x"}}, "the port must be a number from 1 to 65535"},
		{Config{Addrs: []string{"m:11211"}, Timeout: -time.Second}, "must not be negative"},
	} {
		_, err := New(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}

// Over TLS: a store that trusts the server's authority and presents a
// client certificate decides; one that trusts another authority cannot
// connect, and says so.
func TestTLS(t *testing.T) {
	ca := testpki.NewCA(t, "memcached ca")
	srvCert := ca.Issue(t, "127.0.0.1", true)
	client := ca.Issue(t, "quotad", false)
	srv := memcachedtest.Start(t, memcachedtest.WithTLS(srvCert.CertPEM, srvCert.KeyPEM, ca.PEM, true))
	c := newClock(windowStart.Add(time.Minute))
	pair := client.Pair
	s, err := New(context.Background(), Config{Addrs: []string{srv.TLSAddr()}, Timeout: 2 * time.Second, Now: c.now,
		TLS: &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(context.Background()); err != nil {
		t.Fatalf("ping over TLS: %v", err)
	}
	l := hourly(1)
	if d, _ := acquire(t, s, node.AcquireRequest{Base: "{quotad:p:tls}", Limit: l, Cost: 1}); !d.Allowed {
		t.Fatalf("first check over TLS: %+v", d)
	}
	if n := counted(t, srv, "{quotad:p:tls}", l, c); n != 1 {
		t.Fatalf("counter %d over TLS, want 1", n)
	}

	other := testpki.NewCA(t, "another ca")
	wrong, err := New(context.Background(), Config{Addrs: []string{srv.TLSAddr()}, Timeout: 2 * time.Second, Now: c.now,
		TLS: &tls.Config{RootCAs: other.Pool(), Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if err := wrong.Ping(context.Background()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("ping trusting another authority: %v, want a certificate error", err)
	}
	anonymous, err := New(context.Background(), Config{Addrs: []string{srv.TLSAddr()}, Timeout: 2 * time.Second, Now: c.now,
		TLS: &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer anonymous.Close()
	if err := anonymous.Ping(context.Background()); err == nil {
		t.Fatal("ping without a client certificate answered; the server requires one")
	}
}
