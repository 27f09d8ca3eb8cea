package leases

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// Concurrent spenders never spend more units than the grant holds, and
// every unit is spent once.
func TestSpendNeverSpendsAUnitTwice(t *testing.T) {
	var u Units
	u.ExpiresAt, u.Capacity = 1<<62, 1000
	u.Fill(1000)
	clock := func() int64 { return 0 }
	var spent atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, _, ok := u.Spend(3, 0, clock); !ok {
					return
				}
				spent.Add(3)
			}
		}()
	}
	wg.Wait()
	if got := spent.Load(); got != 999 || u.Unspent() != 1 {
		t.Fatalf("spent %d, left %d; want 999 spent in threes and 1 left", got, u.Unspent())
	}
}

// A grant is not spent at or after its expiry, nor when the clock read
// after claiming has passed it: the units claimed then are dropped.
func TestSpendStopsAtExpiry(t *testing.T) {
	var u Units
	u.ExpiresAt, u.Capacity, u.AuthRemaining, u.ResetAt = 100, 50, 10, 150
	u.Fill(20)
	if _, _, ok := u.Spend(1, 100, func() int64 { return 100 }); ok {
		t.Fatal("spent at expiry")
	}
	if _, _, ok := u.Spend(1, 99, func() int64 { return 100 }); ok {
		t.Fatal("spent although the clock had passed the expiry once the unit was claimed")
	}
	if u.Unspent() != 19 {
		t.Fatalf("unspent %d, want 19: the late unit is dropped, not given back", u.Unspent())
	}
	d, left, ok := u.Spend(4, 50, func() int64 { return 60 })
	want := algorithms.Decision{Allowed: true, Limit: 50, Remaining: 25, ResetAfter: 90}
	if !ok || left != 15 || d != want {
		t.Fatalf("Spend(4) = %+v, %d, %t; want %+v, 15, true", d, left, ok, want)
	}
	if _, _, ok := u.Spend(0, 50, func() int64 { return 60 }); !ok || u.Unspent() != 15 {
		t.Fatalf("cost 0 with units held: ok %t, unspent %d; want true and nothing spent", ok, u.Unspent())
	}
	if got := u.Claim(); got != 15 || u.Unspent() != 0 {
		t.Fatalf("Claim = %d, then %d unspent; want 15 then 0", got, u.Unspent())
	}
}

// A key's demand leases only once it is worth MinChecks checks over the
// horizon, and the smoothed rate follows completed samples.
func TestDemandWant(t *testing.T) {
	const horizon = 200 * time.Millisecond
	var d Demand
	d.Start(0)
	d.Asked.Add(3)
	if w := d.Want(int64(time.Millisecond), horizon, 1, 1<<40); w != 0 {
		t.Fatalf("three checks: want %d, want 0 (under %d checks' worth)", w, MinChecks)
	}
	d.Asked.Add(97)
	if w := d.Want(int64(time.Millisecond), horizon, 1, 1<<40); w != 100 {
		t.Fatalf("100 units within the first sample: want %d, want 100 (the checks seen bound the rate)", w)
	}
	if w := d.Want(int64(time.Millisecond), horizon, 1, 40); w != 40 {
		t.Fatalf("capped at 40: want %d", w)
	}
	// The sample ends at 400 ms: 100 units in 0.4 s is 250/s.
	if r := d.Rate(int64(400*time.Millisecond), horizon); r != 250 {
		t.Fatalf("rate %v, want 250", r)
	}
	// A quiet second sample halves it.
	if r := d.Rate(int64(800*time.Millisecond), horizon); r != 125 {
		t.Fatalf("rate %v, want 125", r)
	}
}

// A remembered denial counts its waits down in whole milliseconds,
// rounded up, the reset never before the retry.
func TestCountdown(t *testing.T) {
	d := algorithms.Decision{Limit: 5, RetryAfter: 3 * time.Second, ResetAfter: 3 * time.Second}
	got := Countdown(d, 0, int64(3*time.Second), int64(1500*time.Millisecond+1))
	if got.RetryAfter != 1500*time.Millisecond || got.ResetAfter != 1500*time.Millisecond {
		t.Fatalf("retry %s reset %s; want 1.5s and 1.5s", got.RetryAfter, got.ResetAfter)
	}
	if c := CeilMillis(time.Millisecond + 1); c != 2*time.Millisecond {
		t.Fatalf("CeilMillis(1ms+1ns) = %s", c)
	}
}

type key struct{ a, b string }

func (k key) ShardKey() string { return k.a }

// A full table hands out entries it does not keep, and counts them.
func TestTableIsBounded(t *testing.T) {
	tab := NewTable[key, int](2)
	one := func() *int { v := 1; return &v }
	for _, k := range []key{{"x", "1"}, {"x", "2"}} {
		if _, in := tab.GetOrCreate(k, one); !in {
			t.Fatalf("%v not added to a table with room", k)
		}
	}
	if v, in := tab.GetOrCreate(key{"y", "3"}, one); in || v == nil || tab.Get(key{"y", "3"}) != nil {
		t.Fatalf("a full table kept a third entry (in %t)", in)
	}
	if tab.Len() != 2 || tab.Full() != 1 {
		t.Fatalf("len %d full %d; want 2 and 1", tab.Len(), tab.Full())
	}
	tab.Sweep(func(k key, _ *int) bool { return k.b == "1" })
	if tab.Len() != 1 || tab.Get(key{"x", "1"}) != nil || tab.Remove(key{"x", "2"}) == nil || tab.Len() != 0 {
		t.Fatalf("sweep and remove left len %d", tab.Len())
	}
}
