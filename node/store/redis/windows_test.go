package redis

import (
	"context"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
)

// openStore returns a store on r whose calls time out after timeout,
// closed when the test ends.
func openStore(t *testing.T, r *redistest.Server, timeout time.Duration) *Store {
	t.Helper()
	s, err := New(context.Background(), Config{URL: r.URL(), Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// A fixed window's checks far from the window's edge are plain commands on
// the window's own key, at every node, for a cold key and a warm one alike:
// the count is shared, a cost of 0 only reads, a charge stays counted over
// the limit, and the key expires at the window's end. A check that finds
// the count over the limit gives back what it took and goes to the
// script, which decides it exactly: a lease that would like more than is
// left gets the rest, a denial takes nothing.
func TestFixedWindowChecksWithoutTheScript(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	nodes := []*Store{openStore(t, r, time.Second), openStore(t, r, time.Second)}
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })

	p := time.Hour
	quotadtest.AwayFromWindowEnd(t, p, 10*time.Second)
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: p}
	pm := p.Milliseconds()
	w := time.Now().UnixMilli() / pm * pm
	key := algorithms.WindowKey(algorithms.Keys(algorithms.FixedWindow, "{plain}")[0], pm, w)
	count := func() int64 {
		t.Helper()
		n, err := rdb.Get(ctx, key).Int64()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		return n
	}
	check := func(i int, req node.AcquireRequest) (algorithms.Decision, algorithms.Grant) {
		t.Helper()
		req.Base, req.Limit = "{plain}", l
		if req.Want == 0 {
			req.Want = req.Cost
		}
		d, g, err := nodes[i%2].Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return d, g
	}

	for i := range 7 {
		if d, _ := check(i, node.AcquireRequest{Cost: 1}); !d.Allowed || d.Remaining != int64(9-i) {
			t.Fatalf("check %d: %+v, want allowed with %d remaining", i, d, 9-i)
		}
	}
	if d, _ := check(0, node.AcquireRequest{Cost: 0}); !d.Allowed || d.Remaining != 3 {
		t.Fatalf("cost 0: %+v, want allowed with 3 remaining", d)
	}
	// A lease that would like 5 of the 3 left gets 3, and the other 2 go back.
	d, g := check(1, node.AcquireRequest{Cost: 1, Want: 5})
	if !d.Allowed || g.Units != 3 || g.Ref != w || d.Remaining != 0 {
		t.Fatalf("lease: %+v %+v, want 3 units of window %d and none remaining", d, g, w)
	}
	if n := count(); n != 10 {
		t.Fatalf("the window counts %d after the lease, want 10", n)
	}
	// Denials take nothing.
	for i := range 4 {
		if d, _ := check(i, node.AcquireRequest{Cost: 1}); d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("check over the limit: %+v, want a denial", d)
		}
	}
	if n := count(); n != 10 {
		t.Fatalf("the window counts %d after denials, want 10", n)
	}
	// A charge counts all the same.
	if d, _ := check(0, node.AcquireRequest{Cost: 4, Charge: true}); d.Allowed {
		t.Fatalf("charge over the limit: %+v, want a denial", d)
	}
	if n := count(); n != 14 {
		t.Fatalf("the window counts %d after a charge of 4, want 14", n)
	}
	ttl, err := rdb.PTTL(ctx, key).Result()
	if left := time.Duration(w+pm-time.Now().UnixMilli()) * time.Millisecond; err != nil || ttl <= 0 || ttl > left+time.Second {
		t.Fatalf("TTL of %s: %v (%v), want the rest of the window, %v", key, ttl, err, left)
	}
	// The node remembers the window counting, so its next INCRBY goes
	// without PEXPIREAT; a key deleted meanwhile (a reset) is recreated
	// by it, and given its TTL once the reply shows the count was 0.
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if d, _ := check(0, node.AcquireRequest{Cost: 1}); !d.Allowed || d.Remaining != 9 {
		t.Fatalf("after the key was deleted: %+v, want allowed with 9 remaining", d)
	}
	if ttl, err := rdb.PTTL(ctx, key).Result(); err != nil || ttl <= 0 {
		t.Fatalf("TTL of %s recreated by a lone INCRBY: %v (%v), want the rest of the window", key, ttl, err)
	}
	// The lease and the four denials went to the script after their
	// plain INCRBY; nothing else did.
	if scripts := nodes[0].ScriptCalls() + nodes[1].ScriptCalls(); scripts != 5 {
		t.Fatalf("%d script calls, want 5: the lease's and the denials'", scripts)
	}
}

// A window shorter than a check may take is too close to its edge for the
// node to know which window Redis's clock will be in: its checks go to the
// script, and come out as the script decides.
func TestFixedWindowNearItsEdgeGoesToTheScript(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	s := openStore(t, r, 50*time.Millisecond)
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: 20 * time.Millisecond}
	for i := range 50 {
		if _, _, err := s.Acquire(ctx, node.AcquireRequest{Base: "{edge}", Limit: l, Cost: 1, Want: 1}); err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
	}
	if s.PlainCalls() != 0 || s.ScriptCalls() == 0 {
		t.Fatalf("%d plain calls and %d script calls, want the script alone", s.PlainCalls(), s.ScriptCalls())
	}
}

// Three nodes check one key of a short fixed window (and of a sliding
// counter) from many goroutines for several windows, so that checks land
// near the edges (the script) and far from them (plain commands), leases
// and denials among them: no window ever grants more than its limit, and
// what Redis counts for each window is what was granted in it.
func TestWindowPlainAndScriptChecksNeverOverTheLimit(t *testing.T) {
	for _, a := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) { testWindowChecksNeverOver(t, a) })
	}
}

func testWindowChecksNeverOver(t *testing.T, a algorithms.Algorithm) {
	r := redistest.Start(t)
	ctx := context.Background()
	var nodes []*Store
	for range 3 {
		nodes = append(nodes, openStore(t, r, 20*time.Millisecond))
	}
	l := algorithms.Limit{Algorithm: a, Limit: 50, Period: 250 * time.Millisecond}
	var mu sync.Mutex
	granted := map[int64]int64{}
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for gi := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := nodes[gi%3]
			for i := 0; time.Now().Before(stop); i++ {
				want := int64(1 + i%4)
				_, g, err := s.Acquire(ctx, node.AcquireRequest{Base: "{race}", Limit: l, Cost: 1, Want: want})
				if err != nil || g.Units == 0 {
					continue
				}
				mu.Lock()
				granted[g.Ref] += g.Units
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var plain, scripts int64
	for _, s := range nodes {
		plain += s.PlainCalls()
		scripts += s.ScriptCalls()
	}
	if plain == 0 || scripts == 0 {
		t.Fatalf("%d plain calls and %d script calls, want both", plain, scripts)
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer rdb.Close()
	prefix := algorithms.Keys(a, "{race}")[0]
	for w, n := range granted {
		if n > l.Limit {
			t.Errorf("window %d granted %d, limit %d", w, n, l.Limit)
		}
		// The window's key may have expired already; one that still lives
		// counts exactly what was granted.
		if c, err := rdb.Get(ctx, algorithms.WindowKey(prefix, l.PeriodMillis(), w)).Int64(); err == nil && c != n {
			t.Errorf("window %d: Redis counts %d, %d were granted", w, c, n)
		}
	}
	t.Logf("%d windows, %d plain calls, %d script calls", len(granted), plain, scripts)
}

// The node's bounds of Redis's clock hold every TIME read between them.
func TestRedisClockBoundsHoldTIME(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	s := openStore(t, r, time.Second)
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer rdb.Close()
	for i := range 200 {
		lo, _, ok := s.clock.bounds(0)
		now, err := rdb.Time(ctx).Result()
		_, hi, ok2 := s.clock.bounds(0)
		if err != nil || !ok || !ok2 {
			t.Fatalf("sample %d: %v, estimate %v %v", i, err, ok, ok2)
		}
		if ms := now.UnixMilli(); ms < lo || ms > hi {
			t.Fatalf("sample %d: TIME %d ms outside [%d, %d]", i, ms, lo, hi)
		}
		if hi-lo > 20 {
			t.Fatalf("sample %d: bounds %d ms apart on loopback", i, hi-lo)
		}
	}
}

// A clock that steps is noticed at the next sample: the estimate is not
// used until a second sample agrees with it.
func TestRedisClockStepStopsTheEstimate(t *testing.T) {
	c := newRedisClock()
	now := c.since()
	c.accept(1_000_000, 1_000_100, now)
	c.accept(1_000_000, 1_000_100, now+1)
	if _, _, ok := c.bounds(0); !ok {
		t.Fatal("two samples that agree: no estimate")
	}
	c.accept(1_000_000+int64(time.Second/time.Microsecond), 1_000_100+int64(time.Second/time.Microsecond), now+2)
	if _, _, ok := c.bounds(0); ok {
		t.Fatal("a sample a second off the last: the estimate is still used")
	}
	c.accept(1_000_000+int64(time.Second/time.Microsecond), 1_000_100+int64(time.Second/time.Microsecond), now+3)
	if _, _, ok := c.bounds(0); !ok {
		t.Fatal("two samples agree again: no estimate")
	}
}

// A sliding window counter's checks far from the window's edge are plain
// commands too: the previous window's GET, the INCRBY of the window's own
// key; the count is shared between nodes and the key lives until the end
// of the next window.
func TestSlidingCounterChecksWithoutTheScript(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	nodes := []*Store{openStore(t, r, time.Second), openStore(t, r, time.Second)}
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer rdb.Close()
	p := time.Hour
	quotadtest.AwayFromWindowEnd(t, p, 10*time.Second)
	l := algorithms.Limit{Algorithm: algorithms.SlidingWindowCounter, Limit: 10, Period: p}
	pm := p.Milliseconds()
	w := time.Now().UnixMilli() / pm * pm
	key := algorithms.WindowKey(algorithms.Keys(l.Algorithm, "{sc}")[0], pm, w)
	for i := range 6 {
		d, _, err := nodes[i%2].Acquire(ctx, node.AcquireRequest{Base: "{sc}", Limit: l, Cost: 1, Want: 1})
		if err != nil || !d.Allowed || d.Remaining != int64(9-i) {
			t.Fatalf("check %d: %+v %v, want allowed with %d remaining", i, d, err, 9-i)
		}
	}
	if n, err := rdb.Get(ctx, key).Int64(); err != nil || n != 6 {
		t.Fatalf("the window counts %d (%v), want 6", n, err)
	}
	ttl, err := rdb.PTTL(ctx, key).Result()
	if left := time.Duration(w+2*pm-time.Now().UnixMilli()) * time.Millisecond; err != nil || ttl <= left-p || ttl > left+time.Second {
		t.Fatalf("TTL of %s: %v (%v), want the rest of the window and the next, %v", key, ttl, err, left)
	}
	if scripts := nodes[0].ScriptCalls() + nodes[1].ScriptCalls(); scripts != 0 {
		t.Fatalf("%d script calls, want none", scripts)
	}
}
