package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/delayproxy"
	"github.com/quotad/quotad/internal/redistest"
)

// window is a batch window far longer than any call here takes: a call
// that waited for it would show.
const window = 10 * time.Second

// newWindowed returns a store on a fresh redis-server whose check pipeline
// waits up to window for company, and a script to call through it.
func newWindowed(t *testing.T, window time.Duration) (*pipeline, *goredis.Script) {
	t.Helper()
	r := redistest.Start(t)
	s, err := New(context.Background(), Config{URL: r.URL(), Timeout: time.Hour, BatchWindow: window})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if s.checkPipe.window != window {
		t.Fatalf("window %s, want %s", s.checkPipe.window, window)
	}
	sc := goredis.NewScript("return 1")
	if err := sc.Load(context.Background(), s.client).Err(); err != nil {
		t.Fatal(err)
	}
	return s.checkPipe, sc
}

// call makes one call through p and reports how long it took.
func call(t *testing.T, p *pipeline, sc *goredis.Script) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := p.run(context.Background(), time.Hour, sc, nil, []string{"k"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// A lone call on a quiet pipeline goes at once, however long the batch
// window.
func TestLoneCallIsNotHeldByTheWindow(t *testing.T) {
	p, sc := newWindowed(t, window)
	took := call(t, p, sc)
	t.Logf("first call: %s", took)
	if n := p.waited.Load(); n != 0 || took >= window/2 {
		t.Fatalf("the first call took %s and %d batches waited for company: it was held by the %s window", took, n, window)
	}
}

// One caller calling back to back, however fast, has nobody to wait for:
// none of its calls waits for company.
func TestBackToBackCallerIsNotHeldByTheWindow(t *testing.T) {
	p, sc := newWindowed(t, window)
	start := time.Now()
	for range 300 {
		call(t, p, sc)
	}
	t.Logf("300 calls back to back: %s", time.Since(start))
	if n := p.waited.Load(); n != 0 {
		t.Fatalf("%d of one caller's back-to-back calls waited for company", n)
	}
}

// A call that comes after calls stopped coming for longer than half the
// window goes at once: a busy spell does not make a quiet node wait.
func TestCallAfterAPauseIsNotHeldByTheWindow(t *testing.T) {
	const window = 20 * time.Millisecond
	p, sc := newWindowed(t, window)

	// A busy spell: calls one after another, so the pipeline has seen
	// calls come fast.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				call(t, p, sc)
			}
		}()
	}
	wg.Wait()
	t.Logf("busy spell: %d calls waited for company", p.waited.Load())

	// Then quiet: the next call finds the last one long past.
	time.Sleep(2 * window) // the pause itself is what is tested
	before := p.waited.Load()
	took := call(t, p, sc)
	t.Logf("call after the pause: %s", took)
	if n := p.waited.Load() - before; n != 0 {
		t.Fatalf("the call after a pause took %s and waited for company (%d batches waited): it was held by the window", took, n)
	}
}

// Calls that keep coming share round trips through the window, and none
// waits longer than the window for it.
func TestSteadyCallsWaitForCompany(t *testing.T) {
	p, sc := newWindowed(t, window)
	const workers, each = 8, 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				took := call(t, p, sc)
				mu.Lock()
				slowest = max(slowest, took)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	trips, waited := p.roundTrips.Load(), p.waited.Load()
	t.Logf("%d calls in %d round trips, %d of which waited for company; slowest call %s", workers*each, trips, waited, slowest)
	if waited == 0 {
		t.Errorf("no batch waited for company while %d callers called back to back", workers)
	}
	if trips >= workers*each {
		t.Errorf("%d calls took %d round trips: none shared one", workers*each, trips)
	}
	if slowest >= window {
		t.Errorf("a call took %s, the whole window of %s: waiting did not stop when calls stopped coming", slowest, window)
	}
}

// A call whose deadline is near never waits for company, however busy the
// pipeline looks; one without a deadline, in the same state, does (up to
// a few of the usual gaps, since no company comes).
func TestCallNearItsDeadlineIsNotHeldByTheWindow(t *testing.T) {
	p, sc := newWindowed(t, window)
	busy := func() {
		p.gap.Store(int64(time.Millisecond))
		p.others.Store(4 * companyScale)
		p.lastCall.Store(int64(time.Since(p.epoch)))
	}

	busy()
	// This call has less time left than two windows: it must go at once.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.run(ctx, time.Hour, sc, nil, []string{"k"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := p.waited.Load(); n != 0 {
		t.Fatalf("a call with 5s left and a %s window waited for company (%d batches waited)", window, n)
	}
	// The same with the time left set by the call's own timeout.
	busy()
	if _, err := p.run(context.Background(), 5*time.Second, sc, nil, []string{"k"}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := p.waited.Load(); n != 0 {
		t.Fatalf("a call with a 5s timeout and a %s window waited for company (%d batches waited)", window, n)
	}

	busy()
	took := call(t, p, sc)
	t.Logf("call without a deadline on a busy-looking pipeline: %s", took)
	if n := p.waited.Load(); n != 1 {
		t.Fatalf("%d batches waited for company, want 1: the pipeline did not take itself for busy", n)
	}
}

// Calls of one batch script share a call of it up to MaxBatchChecks calls
// and MaxBatchKeyBytes of keys: a flood of 1 KiB keys goes in calls that
// each hold Redis briefly, while typical keys still fill whole calls.
func TestWireCallsBoundKeyBytes(t *testing.T) {
	single, batch := goredis.NewScript("return 1"), goredis.NewScript("return 2")
	calls := func(n, keyLen int) []*scriptCall {
		cs := make([]*scriptCall, n)
		for i := range cs {
			cs[i] = &scriptCall{script: single, batch: batch, keys: []string{strings.Repeat("k", keyLen)}}
		}
		return cs
	}
	sizes := func(wire []*wireCall) []int {
		var n []int
		for _, w := range wire {
			n = append(n, len(w.members))
		}
		return n
	}
	perCall := algorithms.MaxBatchKeyBytes / 1024
	for _, tc := range []struct {
		name        string
		calls       []*scriptCall
		want        []int
		wantBatches int
	}{
		{"typical keys", calls(100, 30), []int{algorithms.MaxBatchChecks, 100 - algorithms.MaxBatchChecks}, 2},
		{"1 KiB keys", calls(2*perCall+1, 1024), []int{perCall, perCall, 1}, 2},
		{"one key over the bound", calls(2, algorithms.MaxBatchKeyBytes+1), []int{1, 1}, 0},
	} {
		wire := wireCalls(tc.calls)
		if got := sizes(wire); !slices.Equal(got, tc.want) {
			t.Errorf("%s: calls per EVALSHA %v, want %v", tc.name, got, tc.want)
		}
		batches := 0
		for _, w := range wire {
			if w.script == batch {
				batches++
				if w.keyBytes > algorithms.MaxBatchKeyBytes {
					t.Errorf("%s: a batch call carries %d key bytes, over %d", tc.name, w.keyBytes, algorithms.MaxBatchKeyBytes)
				}
			}
		}
		if batches != tc.wantBatches {
			t.Errorf("%s: %d batch script calls, want %d", tc.name, batches, tc.wantBatches)
		}
	}
}

// A plain call (a fresh write) goes in its place in the queue: a script
// call of its key queued after it runs after it, in a batch call opened
// after it, while calls of other keys go on joining the batch calls open
// before it, so that fresh writes interleaved with warm keys' checks do
// not split every batch.
func TestWireCallsKeepPlainCallsInOrder(t *testing.T) {
	single, batch := goredis.NewScript("return 1"), goredis.NewScript("return 2")
	script := func(key string) *scriptCall {
		return &scriptCall{script: single, batch: batch, keys: []string{"{" + key + "}:fw3"}}
	}
	plain := func(key string) *scriptCall {
		return &scriptCall{keys: []string{"{" + key + "}:fw3"}, plain: []any{"set", key, "v", "nx"}}
	}
	for _, tc := range []struct {
		calls []*scriptCall
		want  []string
	}{
		{[]*scriptCall{script("a"), script("b"), plain("k"), script("k"), script("c")},
			[]string{"script[{a}:fw3 {b}:fw3]", "plain[{k}:fw3]", "script[{k}:fw3 {c}:fw3]"}},
		{[]*scriptCall{script("a"), plain("k"), script("b"), plain("j"), script("c")},
			[]string{"script[{a}:fw3 {b}:fw3 {c}:fw3]", "plain[{k}:fw3]", "plain[{j}:fw3]"}},
	} {
		var got []string
		for _, w := range wireCalls(tc.calls) {
			kind := "script"
			if w.plain != nil {
				kind = "plain"
			}
			got = append(got, fmt.Sprintf("%s%v", kind, w.keys))
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("wire calls %v, want %v", got, tc.want)
		}
	}
}

// Calls Redis Cluster redirected are resent grouped by slot, each group
// in the order sent: two calls of one key keep their order, while calls
// of other slots need not wait for them.
func TestRedirectedCallsResentInOrderBySlot(t *testing.T) {
	call := func(key string) *wireCall { return &wireCall{keys: []string{key + ":fw3"}} }
	calls := []*wireCall{call("{a}"), call("{b}"), call("{a}"), call("{c}"), call("{b}"), call("{a}")}
	errs := []error{
		errors.New("MOVED 15495 127.0.0.1:7002"), errors.New("ASK 3300 127.0.0.1:7001"), errors.New("MOVED 15495 127.0.0.1:7002"),
		nil, errors.New("TRYAGAIN Multiple keys request during rehashing of slot"), errors.New("CLUSTERDOWN The cluster is down"),
	}
	cmds := make([]*goredis.Cmd, len(calls))
	for i := range cmds {
		cmds[i] = goredis.NewCmd(context.Background())
		if errs[i] != nil {
			cmds[i].SetErr(errs[i])
		}
	}
	got := redirectedBySlot(calls, cmds)
	// {a}: calls 0 and 2 (5, CLUSTERDOWN, is no redirection); {b}: 1 and
	// 4; {c}: answered.
	want := [][]int{{0, 2}, {1, 4}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("groups %v, want %v", got, want)
	}
}

// A call whose reply comes after its caller left (its deadline passed)
// hands the reply to the call's late function.
func TestLateReplyGoesToTheCallsLateFunction(t *testing.T) {
	r := redistest.Start(t)
	px := delayproxy.Start(t, r.Addr())
	const timeout = 50 * time.Millisecond
	s, err := New(context.Background(), Config{URL: "redis://" + px.Addr() + "/0", Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc := goredis.NewScript("return 'late'")
	if err := sc.Load(context.Background(), s.client).Err(); err != nil {
		t.Fatal(err)
	}
	px.SetDelay(0, 4*timeout)
	late := make(chan any, 1)
	_, err = s.checkPipe.run(context.Background(), timeout, sc, nil, []string{"k"}, nil, func(reply any) { late <- reply })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call whose reply is %s late, with a %s timeout: %v, want a deadline (Redis late)", 4*timeout, timeout, err)
	}
	select {
	case reply := <-late:
		if reply != "late" {
			t.Fatalf("late reply %v", reply)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the late reply never reached the late function")
	}
}
