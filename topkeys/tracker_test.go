package topkeys_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/quotad/quotad/topkeys"
)

func newTracker(t testing.TB, cfg topkeys.Config) *topkeys.Tracker {
	t.Helper()
	tr, err := topkeys.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// skewedStream returns a shuffled stream of 20 heavy keys, heavy-i denied
// 5000+100·i times, among 100,000 keys denied once each, and the true
// counts.
func skewedStream() ([]string, map[string]uint64) {
	truth := map[string]uint64{}
	var stream []string
	for i := range 20 {
		k := fmt.Sprintf("heavy-%02d", i)
		for range 5000 + 100*i {
			stream = append(stream, k)
		}
		truth[k] = uint64(5000 + 100*i)
	}
	for i := range 100_000 {
		k := "noise-" + strconv.Itoa(i)
		stream = append(stream, k)
		truth[k] = 1
	}
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	return stream, truth
}

// A skewed stream: the 20 heavy keys are denied more than total/64 times
// each, so Space-Saving with 64 counters must track all of them, and no key
// denied once can outrank one. The report must be exactly the heavy keys,
// most denied first, each with a true count inside [Count−Error, Count].
func TestTopFindsTheTrueTopKeysOfASkewedStream(t *testing.T) {
	stream, truth := skewedStream()
	tr := newTracker(t, topkeys.Config{})
	for _, k := range stream {
		tr.Add("api", k)
	}
	r := tr.Top()
	if len(r.Policies) != 1 || r.Policies[0].Policy != "api" {
		t.Fatalf("policies %+v, want api alone", r.Policies)
	}
	top := r.Policies[0]
	if top.Denials != uint64(len(stream)) {
		t.Errorf("denials %d, want %d", top.Denials, len(stream))
	}
	if len(top.Keys) != 20 {
		t.Fatalf("%d keys, want 20", len(top.Keys))
	}
	for i, e := range top.Keys {
		want := fmt.Sprintf("heavy-%02d", 19-i)
		if e.Key != want {
			t.Errorf("rank %d: %s (count %d ± %d), want %s (true count %d)", i+1, e.Key, e.Count, e.Error, want, truth[want])
		}
		if tc := truth[e.Key]; tc > e.Count || tc < e.Count-e.Error {
			t.Errorf("%s: true count %d outside [%d, %d]", e.Key, tc, e.Count-e.Error, e.Count)
		}
	}
	t.Logf("top 3: %+v; largest error %d", top.Keys[:3], slices.MaxFunc(top.Keys, func(a, b topkeys.Entry) int { return int(a.Error) - int(b.Error) }).Error)
}

// A Zipf stream (s = 1.3) over 50,000 keys, spread over three intervals:
// the top 10 of the merged report are the true top 10, in order.
func TestTopMergesIntervalsOfAZipfStream(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	z := rand.NewZipf(r, 1.3, 1, 49_999)
	tr := newTracker(t, topkeys.Config{Top: 10})
	truth := map[string]uint64{}
	for interval := range 3 {
		for range 100_000 {
			k := "user-" + strconv.FormatUint(z.Uint64(), 10)
			truth[k]++
			tr.Add("api", k)
		}
		if interval < 2 {
			tr.Advance()
		}
	}
	var keys []string
	for k := range truth {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return int(truth[b]) - int(truth[a]) })
	got := tr.Top().Policies[0].Keys
	for i, e := range got {
		if e.Key != keys[i] {
			t.Errorf("rank %d: %s (%d ± %d), want %s (%d)", i+1, e.Key, e.Count, e.Error, keys[i], truth[keys[i]])
		}
		if tc := truth[e.Key]; tc > e.Count || tc < e.Count-e.Error {
			t.Errorf("%s: true count %d outside [%d, %d]", e.Key, tc, e.Count-e.Error, e.Count)
		}
	}
}

// However many distinct keys and policies arrive, the tracker holds at
// most Policies × Intervals × Counters keys in slots allocated up front,
// and the heap does not grow with the number of distinct keys.
func TestMemoryIsFixedWhateverTheNumberOfDistinctKeys(t *testing.T) {
	cfg := topkeys.Config{Counters: 32, Intervals: 3, Policies: 4}
	tr := newTracker(t, cfg)
	const keyLen = 16 // "k-" and up to 14 digits
	feed := func(from, to int) {
		for i := from; i < to; i++ {
			k := "k-" + strconv.Itoa(i)
			tr.Add("p"+strconv.Itoa(i%6), k) // six policies, two beyond the bound
			if i%100_000 == 0 {
				tr.Advance()
			}
		}
	}
	check := func(after int) topkeys.Size {
		sz := tr.Size()
		if sz.Policies > 4 || sz.Slots != sz.Policies*3*32 || sz.Slots > cfg.MaxSlots() || sz.Entries > sz.Slots || sz.KeyBytes > sz.Entries*keyLen {
			t.Fatalf("after %d distinct keys: %+v exceeds the bound (max slots %d, keys ≤ %d bytes)", after, sz, cfg.MaxSlots(), keyLen)
		}
		return sz
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	feed(0, 10_000)
	small := check(10_000)
	before := heap()
	feed(10_000, 1_000_000)
	large := check(1_000_000)
	after := heap()
	if large.Slots != small.Slots || large.Policies != small.Policies {
		t.Errorf("slots grew from %+v to %+v", small, large)
	}
	// The slots are allocated; only which short keys they hold changes.
	const slack = 1 << 20
	if after > before+slack {
		t.Errorf("heap grew by %d bytes from 10,000 to 1,000,000 distinct keys", after-before)
	}
	if r := tr.Top(); r.Untracked == 0 || len(r.Policies) != 4 {
		t.Errorf("untracked %d, %d policies reported; want the two policies past the bound counted as untracked", r.Untracked, len(r.Policies))
	}
	t.Logf("size %+v (max %d slots of %d bytes), heap %d → %d bytes", large, cfg.MaxSlots(), topkeys.SlotBytes, before, after)
}

// Denials stay in the report for Intervals intervals, the current one
// included, then leave it.
func TestWindowSpansIntervals(t *testing.T) {
	tr := newTracker(t, topkeys.Config{Intervals: 3})
	tr.Add("api", "old")
	tr.Add("api", "old")
	tr.Advance()
	tr.Add("api", "new")
	tr.Advance()
	if top := tr.Top().Policies; len(top) != 1 || top[0].Denials != 3 || top[0].Keys[0] != (topkeys.Entry{Key: "old", Count: 2}) {
		t.Fatalf("after 2 advances: %+v, want old (2) and new (1), 3 denials", top)
	}
	tr.Advance()
	if top := tr.Top().Policies; len(top) != 1 || top[0].Denials != 1 || len(top[0].Keys) != 1 || top[0].Keys[0].Key != "new" {
		t.Fatalf("after 3 advances: %+v, want only new", top)
	}
	tr.Advance()
	if top := tr.Top().Policies; len(top) != 0 {
		t.Fatalf("after 4 advances: %+v, want nothing", top)
	}
	// A summary reused for a later interval starts empty.
	tr.Add("api", "later")
	if top := tr.Top().Policies; len(top) != 1 || top[0].Denials != 1 || top[0].Keys[0].Key != "later" {
		t.Fatalf("reused interval: %+v", top)
	}
}

func TestConcurrentAddAdvanceAndTop(t *testing.T) {
	tr := newTracker(t, topkeys.Config{Counters: 8, Top: 4, Intervals: 2})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20_000 {
				tr.Add("p"+strconv.Itoa(g%2), "k"+strconv.Itoa(i%50))
				if i%5000 == 0 {
					tr.Advance()
					_ = tr.Top()
					_ = tr.Size()
				}
			}
		})
	}
	wg.Wait()
	for _, p := range tr.Top().Policies {
		if len(p.Keys) > 4 {
			t.Errorf("%s: %d keys, want at most 4", p.Policy, len(p.Keys))
		}
	}
}

func TestAddDoesNotAllocate(t *testing.T) {
	tr := newTracker(t, topkeys.Config{Counters: 16})
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	tr.Add("api", "warm") // the policy's first denial allocates its summaries
	i := 0
	if a := testing.AllocsPerRun(10_000, func() {
		tr.Add("api", keys[i%len(keys)])
		i++
	}); a != 0 {
		t.Fatalf("Add allocates %v times per call", a)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []topkeys.Config{{Counters: -1}, {Top: -1}, {Intervals: -1}, {Policies: -1}, {Counters: 4, Top: 5}} {
		if _, err := topkeys.New(c); !errors.Is(err, topkeys.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
	// Fewer counters than the default top caps the top.
	if _, err := topkeys.New(topkeys.Config{Counters: 10}); err != nil {
		t.Errorf("10 counters: %v", err)
	}
	if got := (topkeys.Config{}).MaxSlots(); got != topkeys.DefaultPolicies*topkeys.DefaultIntervals*topkeys.DefaultCounters {
		t.Errorf("default MaxSlots %d", got)
	}
}

func BenchmarkAdd(b *testing.B) {
	tr := newTracker(b, topkeys.Config{})
	stream, _ := skewedStream()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			tr.Add("api", stream[i%len(stream)])
			i++
		}
	})
}
