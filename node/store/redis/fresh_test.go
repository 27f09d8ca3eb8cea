package redis

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/delayproxy"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
)

// A check of a key with no state is one plain SET, not a script call; the
// next check of that key, remembered, goes to the script, which reads the
// state the SET wrote. A node that does not remember a key another node
// wrote tries the SET, finds the state and goes to the script: the two
// nodes' checks share one count, under every algorithm but the window
// algorithms, whose checks are plain commands whatever their keys hold.
// The sliding log writes its one entry into its meta key.
func TestColdKeysAreWrittenWithoutTheScript(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	first, second := openStore(t, r, time.Second), openStore(t, r, time.Second)
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })

	calls := func(s *Store) (fresh, scripts int64) { return s.PlainCalls(), s.ScriptCalls() }
	acquire := func(s *Store, l algorithms.Limit, wantFresh, wantScripts, wantRemaining int64) {
		t.Helper()
		fresh0, scripts0 := calls(s)
		d, _, err := s.Acquire(ctx, node.AcquireRequest{Base: "{cold}", Limit: l, Cost: 1, Want: 1})
		if err != nil {
			t.Fatal(err)
		}
		fresh1, scripts1 := calls(s)
		if fresh1-fresh0 != wantFresh || scripts1-scripts0 != wantScripts {
			t.Fatalf("%s: %d fresh writes and %d script calls, want %d and %d", l.Algorithm, fresh1-fresh0, scripts1-scripts0, wantFresh, wantScripts)
		}
		if !d.Allowed || d.Remaining != wantRemaining {
			t.Fatalf("%s: %+v, want allowed with %d remaining", l.Algorithm, d, wantRemaining)
		}
	}

	for _, a := range algorithms.Algorithms() {
		if algorithms.HasWindowKeys(a) {
			continue // plain commands whatever the key holds (windows_test.go)
		}
		l := algorithms.Limit{Algorithm: a, Limit: 10, Period: time.Hour}
		acquire(first, l, 1, 0, 9)
		v, err := rdb.Get(ctx, algorithms.FreshKey(a, algorithms.Keys(a, "{cold}"))).Result()
		if err != nil || !strings.HasPrefix(v, "r") {
			t.Fatalf("%s: the state after a fresh write is %q (%v), want its fresh form", a, v, err)
		}
		acquire(first, l, 0, 1, 8)
		acquire(second, l, 1, 1, 7)
		acquire(second, l, 0, 1, 6)
	}
}

// A fresh write that finds state costs its check a second round trip. On
// a Redis whose round trip is a good part of the timeout (18ms away, 50ms
// timeout) that second trip missed the deadline: of eight concurrent checks
// of a cold key that cannot lease, one took the fail-closed answer on a
// live Redis. There every check goes straight to the script, whatever the
// key memory says, and is decided in one round trip. And a key written
// fresh is remembered from the write's reply, as one the script read is:
// a state that lives a few ms (a high rate) is not guessed gone as soon as
// the write comes back.
func TestFreshWritesOnlyWhereTwoRoundTripsFit(t *testing.T) {
	r := redistest.Start(t)
	px := delayproxy.Start(t, r.Addr())
	ctx := context.Background()
	open := func(addr string) *Store {
		s, err := New(ctx, Config{URL: "redis://" + addr + "/0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	acquire := func(s *Store, l algorithms.Limit, key string) (fresh, scripts int64) {
		t.Helper()
		fresh0, scripts0 := s.PlainCalls(), s.ScriptCalls()
		d, _, err := s.Acquire(ctx, node.AcquireRequest{Base: key, Limit: l, Cost: 1, Want: 1})
		if err != nil || !d.Allowed {
			t.Fatalf("%s %s: %+v, %v", l.Algorithm, key, d, err)
		}
		return s.PlainCalls() - fresh0, s.ScriptCalls() - scripts0
	}

	// A high rate: one unit's state lives 4ms.
	fast := algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1_000_000, Period: time.Hour}
	near := open(r.Addr())
	if fresh, scripts := acquire(near, fast, "{near}"); fresh != 1 || scripts != 0 {
		t.Fatalf("a cold key on a near Redis: %d fresh writes and %d script calls, want one fresh write", fresh, scripts)
	}
	time.Sleep(20 * time.Millisecond) // the state has expired; the node still takes the key for hot
	if fresh, scripts := acquire(near, fast, "{near}"); fresh != 0 || scripts != 1 {
		t.Fatalf("a key written fresh 20ms ago: %d fresh writes and %d script calls, want the script", fresh, scripts)
	}

	px.SetDelay(18*time.Millisecond, 18*time.Millisecond)
	far := open(px.Addr())
	acquire(far, fast, "{warm}") // learns the round trip
	// The pipeliner notes a round trip's time once it has handed out the
	// replies, so the caller may be back before the note is.
	for deadline := time.Now().Add(time.Second); far.checkPipe.roomForTwo(far.cfg.Timeout); {
		if time.Now().After(deadline) {
			t.Fatal("the far Redis's round trip was not learned within a second")
		}
		time.Sleep(time.Millisecond)
	}
	for _, a := range []algorithms.Algorithm{algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.GCRA} {
		l := algorithms.Limit{Algorithm: a, Limit: 10, Period: time.Hour}
		start := time.Now()
		fresh, scripts := acquire(far, l, "{far}")
		took := time.Since(start)
		if fresh != 0 || scripts != 1 {
			t.Errorf("%s: a cold key on a Redis 36ms round trip away: %d fresh writes and %d script calls, want the script alone", a, fresh, scripts)
		}
		t.Logf("%s: cold check on the far Redis took %s", a, took.Round(time.Millisecond))
	}
}

// The key memory is a guess that forgets: a key is remembered until the
// time noted, and one that shares its slot replaces it.
func TestKeyMemory(t *testing.T) {
	m := newKeyMemory()
	now := time.Now()
	if m.holds("a", now) {
		t.Fatal("a key never noted is remembered")
	}
	m.note("a", now, 1000)
	if !m.holds("a", now) || m.holds("a", now.Add(2*time.Second)) {
		t.Fatal("a key is not remembered until the time noted, and only until then")
	}
	// A TTL of centuries (a Decision's wait saturates near 292 years) is
	// remembered, not wrapped around to the past.
	m.note("a", now, math.MaxInt64/int64(time.Millisecond))
	if !m.holds("a", now.Add(24*time.Hour)) {
		t.Fatal("a key noted with the longest TTL is not remembered a day later")
	}
	// Find a key of a's slot, other than a.
	slot, _ := m.slot("a")
	other := ""
	for i := 0; other == ""; i++ {
		k := "k" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + time.Duration(i).String()
		if s, _ := m.slot(k); s == slot && k != "a" {
			other = k
		}
	}
	if m.holds(other, now) {
		t.Fatalf("%q, sharing a's slot, is taken for a", other)
	}
	m.note(other, now, 1000)
	if m.holds("a", now) || !m.holds(other, now) {
		t.Fatal("a key noted in a taken slot does not replace the one there")
	}
}

// A node that checks keys another node wrote, which it cannot know hold
// state, first tries fresh writes that write nothing; once more than half
// of a window of them have, it sends such checks straight to the script
// for a while: every check is still decided, and the wasted writes stop.
func TestWarmKeysStopFreshWrites(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	first, second := openStore(t, r, time.Second), openStore(t, r, time.Second)
	l := algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Hour}
	const keys = 2 * freshGuardWindow
	acquire := func(s *Store, i int) algorithms.Decision {
		t.Helper()
		d, _, err := s.Acquire(ctx, node.AcquireRequest{Base: "{warm:" + strconv.Itoa(i) + "}", Limit: l, Cost: 1, Want: 1})
		if err != nil || !d.Allowed {
			t.Fatalf("key %d: %+v, %v", i, d, err)
		}
		return d
	}
	for i := range keys {
		acquire(first, i)
	}
	fresh0 := second.PlainCalls()
	for i := range keys {
		if d := acquire(second, i); d.Remaining != 8 {
			t.Fatalf("key %d at the second node: %d remaining, want 8", i, d.Remaining)
		}
	}
	if tried := second.PlainCalls() - fresh0; tried != freshGuardWindow {
		t.Fatalf("the second node tried %d fresh writes on %d warm keys, want one window's worth, %d, and then none", tried, keys, freshGuardWindow)
	}
}
