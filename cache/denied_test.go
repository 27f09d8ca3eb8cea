package cache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/quotad/quotad/algorithms"
)

// t0 is an arbitrary reading of the caller's clock, in milliseconds (a
// Unix time, to show that the zero is the caller's). Denials in
// these tests last seconds to minutes on that clock; ristretto's TTL runs on
// the wall clock for the same duration, which these tests never come near.
const t0 = int64(1_700_000_000_000)

func newTestDenied(t testing.TB, c DeniedConfig) *Denied {
	t.Helper()
	d, err := NewDenied(c)
	if err != nil {
		t.Fatalf("NewDenied(%+v): %v", c, err)
	}
	t.Cleanup(d.Close)
	return d
}

func denial(limit, remaining int64, reset, retry time.Duration) algorithms.Decision {
	return algorithms.Decision{Limit: limit, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

func TestDeniedLookup(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	// 10 units per 100 s refill one every 10 s (a = 1, b = 10,000): a denial
	// of cost 5 with 2 tokens left, 25 s to wait, means each further unit
	// waits 10 s more.
	lim := algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: 100 * time.Second}
	k := Key{Policy: "api", Key: "user-1", Limit: lim}
	d.Add(k, 5, denial(10, 2, 75*time.Second, 25*time.Second), t0)
	d.Wait()

	tests := []struct {
		name  string
		cost  int64
		now   int64
		hit   bool
		retry time.Duration
		reset time.Duration
	}{
		{"same cost at add time", 5, t0, true, 25 * time.Second, 75 * time.Second},
		{"larger cost waits for its own units", 6, t0, true, 35 * time.Second, 75 * time.Second},
		{"larger cost a second later", 6, t0 + 1000, true, 34 * time.Second, 74 * time.Second},
		{"the whole capacity", 10, t0, true, 75 * time.Second, 75 * time.Second},
		{"last millisecond", 5, t0 + 24_999, true, time.Millisecond, 50*time.Second + time.Millisecond},
		{"larger cost after the denied one's end", 6, t0 + 25_000, true, 10 * time.Second, 50 * time.Second},
		{"larger cost at its own end", 6, t0 + 35_000, false, 0, 0},
		{"over the capacity", 11, t0, false, 0, 0},
		{"smaller cost may fit", 4, t0, false, 0, 0},
		{"cost 1", 1, t0, false, 0, 0},
		{"cost 0 means 1", 0, t0, false, 0, 0},
		{"exactly at until", 5, t0 + 25_000, false, 0, 0},
		{"after until", 5, t0 + 120_000, false, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := d.Lookup(k, tt.cost, tt.now)
			if ok != tt.hit {
				t.Fatalf("Lookup(cost %d, now t0%+d) hit = %v, want %v", tt.cost, tt.now-t0, ok, tt.hit)
			}
			want := algorithms.Decision{}
			if tt.hit {
				want = denial(10, 2, tt.reset, tt.retry)
			}
			if got != want {
				t.Errorf("Lookup(cost %d, now t0%+d) = %+v, want %+v", tt.cost, tt.now-t0, got, want)
			}
		})
	}
}

// GCRA 100/min burst 20, a denial of cost 1 with 596 ms
// to wait. Cost 5 waits 2,996 ms, as the authority says; the cache used to
// answer 596 ms, and a client that waited as told was denied again.
func TestDeniedLargerCostGetsItsOwnRetryAfter(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	lim := algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 100, Period: time.Minute, Burst: 20}
	k := Key{Policy: "api", Key: "k", Limit: lim}
	d.Add(k, 1, denial(20, 0, 11_996*time.Millisecond, 596*time.Millisecond), t0)
	d.Wait()
	got, ok := d.Lookup(k, 5, t0)
	if want := denial(20, 0, 11_996*time.Millisecond, 2_996*time.Millisecond); !ok || got != want {
		t.Fatalf("Lookup(cost 5) = %+v, %v; want %+v", got, ok, want)
	}
}

// Under the sliding windows the wait of a larger cost depends on what the
// decision does not carry: only the denied cost is answered.
func TestDeniedSlidingWindowsAnswerOnlyTheDeniedCost(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	for _, alg := range []algorithms.Algorithm{algorithms.SlidingWindowLog, algorithms.SlidingWindowCounter} {
		k := Key{Policy: "api", Key: "k-" + alg.String(), Limit: algorithms.Limit{Algorithm: alg, Limit: 10, Period: time.Minute}}
		d.Add(k, 3, denial(10, 1, time.Minute, 20*time.Second), t0)
		d.Wait()
		if _, ok := d.Lookup(k, 3, t0); !ok {
			t.Errorf("%s: the denied cost missed", alg)
		}
		if got, ok := d.Lookup(k, 4, t0); ok {
			t.Errorf("%s: a larger cost hit: %+v", alg, got)
		}
	}
}

func TestDeniedAddCostZeroIsCostOne(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	lim := algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 10, Period: time.Second}
	k := Key{Policy: "api", Key: "k", Limit: lim}
	d.Add(k, 0, denial(10, 0, time.Second, 100*time.Millisecond), t0)
	d.Wait()
	for cost, retry := range map[int64]time.Duration{0: 100 * time.Millisecond, 1: 100 * time.Millisecond, 2: 200 * time.Millisecond} {
		if got, ok := d.Lookup(k, cost, t0); !ok || got.RetryAfter != retry {
			t.Errorf("after a denial of cost 0, Lookup(cost %d) = %+v, %t; want retry_after %s", cost, got, ok, retry)
		}
	}
}

func TestDeniedResetAfterNeverBelowRetryAfter(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow}}
	// An authority answer whose ResetAfter is shorter than its RetryAfter is
	// odd, but Lookup must still not report a reset before a retry.
	d.Add(k, 3, denial(10, 0, 5*time.Second, 20*time.Second), t0)
	d.Wait()
	for _, now := range []int64{t0, t0 + 4_000, t0 + 10_000} {
		got, ok := d.Lookup(k, 3, now)
		if !ok {
			t.Fatalf("Lookup at t0%+d missed", now-t0)
		}
		wantRetry := 20*time.Second - time.Duration(now-t0)*time.Millisecond
		if got.RetryAfter != wantRetry || got.ResetAfter != wantRetry {
			t.Errorf("Lookup at t0%+d: RetryAfter %s, ResetAfter %s; want both %s", now-t0, got.RetryAfter, got.ResetAfter, wantRetry)
		}
	}
}

func TestDeniedSubMillisecondRetryEndsNoLater(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.LeakyBucket}}
	retry := 60*time.Second + 500*time.Microsecond
	d.Add(k, 1, denial(10, 0, retry, retry), t0)
	d.Wait()
	// The 1.5 ms left is answered in whole milliseconds, rounded up.
	got, ok := d.Lookup(k, 1, t0+59_999)
	if !ok || got.RetryAfter != 2*time.Millisecond {
		t.Errorf("Lookup at t0+59999 = %+v, %v; want a hit with RetryAfter 2ms", got, ok)
	}
	// The denial is rounded down to whole milliseconds: the authority's
	// answer admits the cost 0.5 ms after this, so the cache must not deny.
	if got, ok := d.Lookup(k, 1, t0+60_000); ok {
		t.Errorf("Lookup at t0+60000 = %+v, want a miss", got)
	}
}

func TestDeniedAddIgnoresWhatCannotDeny(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	tests := []struct {
		name string
		cost int64
		dec  algorithms.Decision
	}{
		{"zero RetryAfter", 1, denial(10, 0, time.Second, 0)},
		{"negative RetryAfter", 1, denial(10, 0, time.Second, -time.Second)},
		{"under a millisecond", 1, denial(10, 0, time.Second, 999*time.Microsecond)},
		{"allowed", 1, algorithms.Decision{Allowed: true, Limit: 10, RetryAfter: time.Second}},
		{"negative cost", -1, denial(10, 0, time.Second, time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d.Add(k, tt.cost, tt.dec, t0)
			d.Wait()
			if got, ok := d.Lookup(k, 10, t0); ok {
				t.Errorf("Lookup after Add(%+v) = %+v, want a miss", tt.dec, got)
			}
		})
	}
	if s := d.Stats(); s.Adds != 0 {
		t.Errorf("Stats().Adds = %d, want 0", s.Adds)
	}
}

func TestDeniedForget(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	d.Add(k, 1, denial(10, 0, time.Minute, time.Minute), t0)
	d.Wait()
	if _, ok := d.Lookup(k, 1, t0); !ok {
		t.Fatal("Lookup before Forget missed")
	}
	d.Forget(k)
	if got, ok := d.Lookup(k, 1, t0); ok {
		t.Errorf("Lookup right after Forget = %+v, want a miss", got)
	}
	d.Wait()
	if got, ok := d.Lookup(k, 1, t0); ok {
		t.Errorf("Lookup after Forget and Wait = %+v, want a miss", got)
	}
}

func TestDeniedForgetAppliesToPendingAdd(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	// No Wait between the two: the Add may not be applied yet when Forget
	// runs, and must not resurface afterwards.
	d.Add(k, 1, denial(10, 0, time.Minute, time.Minute), t0)
	d.Forget(k)
	d.Wait()
	if got, ok := d.Lookup(k, 1, t0); ok {
		t.Errorf("Lookup = %+v, want a miss", got)
	}
	if s := d.Stats(); s.Forgets != 1 || s.Adds != 1 {
		t.Errorf("Stats() = %+v, want Adds 1, Forgets 1", s)
	}
}

func TestDeniedLaterAddReplaces(t *testing.T) {
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowLog}}
	t.Run("shorter denial of a smaller cost", func(t *testing.T) {
		d := newTestDenied(t, DeniedConfig{})
		d.Add(k, 5, denial(10, 0, time.Minute, time.Minute), t0)
		d.Wait()
		d.Add(k, 1, denial(10, 0, 20*time.Second, 10*time.Second), t0+1_000)
		d.Wait()
		got, ok := d.Lookup(k, 1, t0+2_000)
		if want := denial(10, 0, 19*time.Second, 9*time.Second); !ok || got != want {
			t.Errorf("Lookup(cost 1) = %+v, %v; want %+v", got, ok, want)
		}
		// The first denial would still cover cost 5; the newer one ended.
		if got, ok := d.Lookup(k, 5, t0+11_000); ok {
			t.Errorf("Lookup(cost 5) after the newer denial ended = %+v, want a miss", got)
		}
	})
	t.Run("larger cost", func(t *testing.T) {
		d := newTestDenied(t, DeniedConfig{})
		d.Add(k, 5, denial(10, 0, time.Minute, time.Minute), t0)
		d.Wait()
		d.Add(k, 8, denial(10, 3, time.Minute, time.Minute), t0)
		d.Wait()
		if got, ok := d.Lookup(k, 5, t0); ok {
			t.Errorf("Lookup(cost 5) after a denial of cost 8 = %+v, want a miss", got)
		}
		if got, ok := d.Lookup(k, 8, t0); !ok || got.Remaining != 3 {
			t.Errorf("Lookup(cost 8) = %+v, %v; want the newer denial", got, ok)
		}
	})
}

func TestDeniedKeysAreDistinct(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "ab", Key: "c", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	d.Add(k, 1, denial(10, 0, time.Minute, time.Minute), t0)
	d.Wait()
	if _, ok := d.Lookup(k, 1, t0); !ok {
		t.Fatalf("Lookup(%+v) missed", k)
	}
	// Another limit on the same policy and key shares the entry's slot but
	// never its denial.
	for _, other := range []Key{
		{Policy: "ab", Key: "c", Limit: algorithms.Limit{Algorithm: algorithms.LeakyBucket}},
		{Policy: "ab", Key: "c", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1}},
	} {
		if got, ok := d.Lookup(other, 1, t0); ok {
			t.Errorf("Lookup(%+v) after a denial of %+v = %+v, want a miss", other, k, got)
		}
	}
	for _, other := range []Key{
		{Policy: "ab", Key: "d", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}},
		{Policy: "xy", Key: "c", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}},
		{Policy: "a", Key: "bc", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}},
		{Policy: "abc", Key: "", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}},
	} {
		if got, ok := d.Lookup(other, 1, t0); ok {
			t.Errorf("Lookup(%+v) after a denial of %+v = %+v, want a miss", other, k, got)
		}
		if d.hash(other) == d.hash(k) {
			t.Errorf("hash(%+v) == hash(%+v)", other, k)
		}
	}
}

// TestDeniedHashCollisionIsAMiss stores, under one Key's hash, an entry for
// another Key, as a 64-bit collision would: Lookup must compare the Keys.
func TestDeniedHashCollisionIsAMiss(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	asked := Key{Policy: "api", Key: "victim", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	stored := Key{Policy: "api", Key: "abuser", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	put := func(k Key) {
		e := &entry{key: k, cost: 1, addedMs: t0, untilMs: t0 + 60_000, retryAfter: time.Minute, resetAfter: time.Minute}
		if !d.c.SetWithTTL(d.hash(asked), e, 1, time.Minute) {
			t.Fatal("ristretto dropped the Set")
		}
		d.Wait()
	}
	put(stored)
	if got, ok := d.Lookup(asked, 1, t0); ok {
		t.Errorf("Lookup(%+v) found %+v stored for %+v under its hash, want a miss", asked, got, stored)
	}
	// The same path with the matching Key hits, so the miss above is the
	// Key comparison and not a failed Set.
	put(asked)
	if _, ok := d.Lookup(asked, 1, t0); !ok {
		t.Errorf("Lookup(%+v) missed its own entry", asked)
	}
}

func TestDeniedHashSeedIsPerCache(t *testing.T) {
	a, b := newTestDenied(t, DeniedConfig{}), newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.GCRA}}
	if first, second := a.hash(k), a.hash(k); first != second {
		t.Error("hash is not deterministic within a cache")
	}
	if a.hash(k) == b.hash(k) {
		t.Error("two caches hash a Key alike; their seeds should differ")
	}
}

// TestDeniedAddCopiesStrings adds Keys whose strings alias a buffer that is
// then overwritten, as a caller reusing its request buffer would.
func TestDeniedAddCopiesStrings(t *testing.T) {
	for _, policy := range []string{"api", ""} {
		t.Run(fmt.Sprintf("policy %q", policy), func(t *testing.T) {
			d := newTestDenied(t, DeniedConfig{})
			buf := []byte("user-1")
			k := Key{Policy: policy, Key: unsafe.String(&buf[0], len(buf)), Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
			d.Add(k, 1, denial(10, 0, time.Minute, time.Minute), t0)
			d.Wait()
			copy(buf, "user-2")
			if _, ok := d.Lookup(Key{Policy: policy, Key: "user-1", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}, 1, t0); !ok {
				t.Error("Lookup of the original key missed after the caller reused its buffer")
			}
		})
	}
}

func TestEntryLayout(t *testing.T) {
	if strconv.IntSize != 64 {
		t.Skip("the layout is documented for 64-bit platforms")
	}
	// entry is documented as 128 bytes (the 128-byte malloc size class),
	// and ristrettoItemBytes was measured alongside it.
	if entryBytes != 128 {
		t.Errorf("unsafe.Sizeof(entry{}) = %d, want 128", entryBytes)
	}
}

func TestDeniedCharges(t *testing.T) {
	keys := []Key{
		{Policy: "p", Key: "a", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}},
		{Policy: "policy", Key: "a longer key", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}},
		{Policy: "", Key: "", Limit: algorithms.Limit{Algorithm: algorithms.GCRA}},
	}
	tests := []struct {
		name string
		cfg  DeniedConfig
		want int64
	}{
		{"entries", DeniedConfig{MaxEntries: 100}, 3},
		{"bytes", DeniedConfig{MaxBytes: 1 << 20}, 3*(entryBytes+ristrettoItemBytes) + int64(len("p")+len("a")+len("policy")+len("a longer key"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDenied(t, tt.cfg)
			for _, k := range keys {
				d.Add(k, 1, denial(10, 0, time.Minute, time.Minute), t0)
			}
			d.Wait()
			s := d.Stats()
			if s.Cost != tt.want || s.MaxCost != tt.cfg.maxCost() {
				t.Errorf("Stats() Cost %d, MaxCost %d; want %d, %d", s.Cost, s.MaxCost, tt.want, tt.cfg.maxCost())
			}
			// Replacing an entry charges it once, not twice.
			d.Add(keys[1], 2, denial(10, 0, time.Minute, time.Minute), t0)
			d.Wait()
			if s := d.Stats(); s.Cost != tt.want {
				t.Errorf("after a replacement, Stats().Cost = %d, want %d", s.Cost, tt.want)
			}
		})
	}
}

func TestDeniedSizing(t *testing.T) {
	const added = 20_000
	tests := []struct {
		name       string
		cfg        DeniedConfig
		maxEntries int
	}{
		{"max entries", DeniedConfig{MaxEntries: 200}, 200},
		{"max bytes", DeniedConfig{MaxBytes: 64 << 10}, int((64<<10)/(entryBytes+ristrettoItemBytes+int64(len("policy")+len("key-00000")))) + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDenied(t, tt.cfg)
			keys := make([]Key, added)
			for i := range keys {
				keys[i] = Key{Policy: "policy", Key: fmt.Sprintf("key-%05d", i), Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow}}
				d.Add(keys[i], 1, denial(10, 0, time.Minute, time.Minute), t0)
			}
			d.Wait()
			s := d.Stats()
			if s.Cost > s.MaxCost || s.Cost <= 0 {
				t.Errorf("Stats().Cost = %d, want 1 to %d", s.Cost, s.MaxCost)
			}
			hits := 0
			for _, k := range keys {
				if _, ok := d.Lookup(k, 1, t0); ok {
					hits++
				}
			}
			if hits == 0 || hits > tt.maxEntries {
				t.Errorf("%d of %d added keys hit, want 1 to %d; stats %+v", hits, added, tt.maxEntries, s)
			}
			if s.Adds != added || s.Dropped+s.Rejected+s.Evicted == 0 {
				t.Errorf("Stats() = %+v, want Adds %d and some dropped, rejected or evicted", s, added)
			}
		})
	}
}

func TestNewDeniedDefaults(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	if s := d.Stats(); s.MaxCost != DefaultDeniedEntries || s.Cost != 0 {
		t.Errorf("Stats() of a zero-config cache = %+v, want MaxCost %d, Cost 0", s, DefaultDeniedEntries)
	}
}

func TestNewDeniedRejectsInvalidConfig(t *testing.T) {
	d, err := NewDenied(DeniedConfig{MaxEntries: -1})
	if !errors.Is(err, ErrInvalidConfig) || d != nil {
		t.Fatalf("NewDenied(MaxEntries -1) = %v, %v; want nil and ErrInvalidConfig", d, err)
	}
	if !strings.Contains(err.Error(), "max entries") {
		t.Errorf("error %q does not name the field", err)
	}
}

func TestDeniedStatsCountsLookups(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	d.Add(k, 2, denial(10, 0, time.Minute, time.Minute), t0)
	d.Wait()
	d.Lookup(k, 2, t0)                // hit
	d.Lookup(k, 1, t0)                // miss: smaller cost
	d.Lookup(k, 2, t0+60_000)         // miss: ended
	d.Lookup(Key{Policy: "x"}, 2, t0) // miss: absent
	d.Forget(k)
	s := d.Stats()
	if s.Hits != 1 || s.Misses != 3 || s.Adds != 1 || s.Forgets != 1 {
		t.Errorf("Stats() = %+v, want Hits 1, Misses 3, Adds 1, Forgets 1", s)
	}
}

func TestDeniedClose(t *testing.T) {
	d, err := NewDenied(DeniedConfig{})
	if err != nil {
		t.Fatal(err)
	}
	k := Key{Policy: "api", Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	d.Add(k, 1, denial(10, 0, time.Minute, time.Minute), t0)
	d.Wait()
	d.Close()
	d.Close()
	if got, ok := d.Lookup(k, 1, t0); ok {
		t.Errorf("Lookup after Close = %+v, want a miss", got)
	}
	d.Add(k, 1, denial(10, 0, time.Minute, time.Minute), t0)
	d.Forget(k)
	d.Wait()
	if _, ok := d.Lookup(k, 1, t0); ok {
		t.Error("Lookup after Close and Add hit")
	}
}

func TestDeniedLookupDoesNotAllocate(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	k := Key{Policy: "api", Key: "user-1", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	d.Add(k, 1, denial(10, 0, time.Minute, time.Minute), t0)
	d.Wait()
	absent := Key{Policy: "api", Key: "user-2", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket}}
	if _, ok := d.Lookup(k, 1, t0); !ok {
		t.Fatal("Lookup missed")
	}
	if n := testing.AllocsPerRun(1000, func() { d.Lookup(k, 1, t0) }); n != 0 {
		t.Errorf("a Lookup hit allocates %v times", n)
	}
	if n := testing.AllocsPerRun(1000, func() { d.Lookup(absent, 1, t0) }); n != 0 {
		t.Errorf("a Lookup miss allocates %v times", n)
	}
}

// TestDeniedConcurrent runs Adds, Lookups and Forgets from many goroutines
// on a few keys. Every Add of key i denies cost i%4+1 for a minute, so
// whatever interleaving happens, a hit must be for at least that cost and
// must report a wait within that minute.
func TestDeniedConcurrent(t *testing.T) {
	const (
		workers = 16
		ops     = 3000
		nkeys   = 32
	)
	d := newTestDenied(t, DeniedConfig{MaxEntries: nkeys / 2})
	keys := make([]Key, nkeys)
	for i := range keys {
		keys[i] = Key{Policy: "api", Key: "k" + strconv.Itoa(i), Limit: algorithms.Limit{Algorithm: algorithms.Algorithms()[i%6]}}
	}
	costOf := func(i int) int64 { return int64(i%4 + 1) }
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	counts := make([][3]uint64, workers)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range ops {
				i := r.IntN(nkeys)
				now := t0 + r.Int64N(30_000)
				switch op := r.IntN(10); {
				case op < 3:
					d.Add(keys[i], costOf(i), denial(10, 0, 2*time.Minute, time.Minute), t0)
					counts[w][0]++
				case op < 4:
					d.Forget(keys[i])
					counts[w][2]++
				default:
					cost := r.Int64N(6)
					got, ok := d.Lookup(keys[i], cost, now)
					counts[w][1]++
					if !ok {
						continue
					}
					wantRetry := time.Minute - time.Duration(now-t0)*time.Millisecond
					if max(cost, 1) < costOf(i) || got.Allowed || got.RetryAfter != wantRetry || got.ResetAfter != wantRetry+time.Minute {
						mu.Lock()
						failures = append(failures, fmt.Sprintf("Lookup(key %d, cost %d, t0%+d) = %+v", i, cost, now-t0, got))
						mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	for _, f := range failures[:min(len(failures), 10)] {
		t.Error(f)
	}
	var adds, lookups, forgets uint64
	for _, c := range counts {
		adds, lookups, forgets = adds+c[0], lookups+c[1], forgets+c[2]
	}
	d.Wait()
	s := d.Stats()
	if s.Adds != adds || s.Hits+s.Misses != lookups || s.Forgets != forgets {
		t.Errorf("Stats() = %+v, want Adds %d, Hits+Misses %d, Forgets %d", s, adds, lookups, forgets)
	}
	if s.Cost > s.MaxCost {
		t.Errorf("Stats().Cost = %d exceeds MaxCost %d", s.Cost, s.MaxCost)
	}
}

// ForgetAll drops every entry, also one whose Add is not yet visible, and
// the cache works as before for later Adds.
func TestDeniedForgetAll(t *testing.T) {
	d := newTestDenied(t, DeniedConfig{})
	keys := []Key{
		{Policy: "api", Key: "a", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow}},
		{Policy: "api", Key: "b", Limit: algorithms.Limit{Algorithm: algorithms.GCRA}},
	}
	d.Add(keys[0], 1, denial(10, 0, time.Minute, time.Minute), t0)
	d.Wait()
	d.Add(keys[1], 1, denial(10, 0, time.Minute, time.Minute), t0) // maybe not visible yet
	d.ForgetAll()
	d.Wait()
	for _, k := range keys {
		if got, ok := d.Lookup(k, 1, t0); ok {
			t.Errorf("Lookup(%s) after ForgetAll = %+v, want a miss", k.Key, got)
		}
	}
	d.Add(keys[0], 1, denial(10, 0, time.Minute, time.Minute), t0+1)
	d.Wait()
	if _, ok := d.Lookup(keys[0], 1, t0+1); !ok {
		t.Error("a denial added after ForgetAll missed")
	}
	if s := d.Stats(); s.ForgetAlls != 1 {
		t.Errorf("Stats().ForgetAlls = %d, want 1", s.ForgetAlls)
	}
}
