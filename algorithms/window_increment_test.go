package algorithms_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
)

// TestWindowIncrementMatchesTheModel drives one key of each window
// algorithm through a random mix of plain commands (WindowIncrement: the
// sliding counter's GET of the previous window, INCRBY and PEXPIREAT ...
// NX, or GET, then the give-back's DECRBY) and check script calls, each at
// its own now within one window of Redis's clock (and for the sliding
// counter with a previous window that counted), and requires every outcome
// to be the Go model's: plain checks, leases, charges and costs of 0, on
// cold keys and warm ones, decide exactly as the script does on the counts
// both share.
func TestWindowIncrementMatchesTheModel(t *testing.T) {
	for _, a := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) { testWindowIncrement(t, a) })
	}
}

func testWindowIncrement(t *testing.T, a algorithms.Algorithm) {
	rdb := startRedis(t)
	ctx := context.Background()
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 7000+uint64(a)))
	check := redis.NewScript(algorithms.CheckScript(a))
	var plain, scripts, givenBack int
	// Every step's now is in the current hour, and its keys live through
	// the sequences.
	p := time.Hour
	quotadtest.AwayFromWindowEnd(t, p, 10*time.Second)
	for n := range 40 {
		l := algorithms.Limit{Algorithm: a, Limit: 1 + rng.Int64N(40), Period: p}
		pm := l.PeriodMillis()
		base := fmt.Sprintf("{test:plain:%d:%d}", seed, n)
		prefix := algorithms.Keys(a, base)[0]
		st := algorithms.NewState(a)
		now := time.Now().UnixMilli()
		w := now - now%pm
		if a == algorithms.SlidingWindowCounter && n%2 == 1 {
			// The previous window counted: in the model by a check then,
			// at Redis by its key.
			spent := rng.Int64N(l.Limit + 1)
			st.Check(l, w-pm/2, spent)
			if err := rdb.Set(ctx, algorithms.WindowKey(prefix, pm, w-pm), spent, time.Duration(2*pm-(now-w)+pm)*time.Millisecond).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for step := range 60 {
			nowMs := now + int64(step)
			cost := rng.Int64N(l.Limit/2 + 2)
			want := cost + rng.Int64N(4)
			charge := rng.IntN(4) == 0
			where := fmt.Sprintf("seed %d, sequence %d, %+v, step %d: cost %d, want %d, charge %v", seed, n, l, step, cost, want, charge)
			var d algorithms.Decision
			var g algorithms.Grant
			if charge {
				d, g = st.Charge(l, nowMs, cost, want, 0)
			} else {
				d, g = st.Acquire(l, nowMs, cost, want, 0)
			}
			var gotD algorithms.Decision
			var gotG algorithms.Grant
			if wi, ok := algorithms.NewWindowIncrement(l, prefix, w, cost, want, charge); ok && rng.IntN(3) > 0 {
				plain++
				readPrev := rng.IntN(2) == 0
				var replies []any
				for _, cmd := range wi.Commands(readPrev, rng.IntN(2) == 0) {
					reply, err := rdb.Do(ctx, cmd...).Result()
					if err == redis.Nil {
						reply, err = nil, nil
					}
					if err != nil {
						t.Fatalf("%s: %v", where, err)
					}
					replies = append(replies, reply)
				}
				// A caller that does not read the previous window knows its
				// count from before.
				var knownPrev int64
				if !readPrev && wi.PrevKey != "" {
					v, err := rdb.Get(ctx, wi.PrevKey).Int64()
					if err != nil && err != redis.Nil {
						t.Fatal(err)
					}
					knownPrev = v
				}
				count, prev, err := wi.Counts(replies, readPrev, knownPrev)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				var back int64
				gotD, gotG, back = wi.Outcome(count, prev, nowMs)
				if back > 0 {
					givenBack++
					first, then := wi.GiveBack(back)
					if err := rdb.Do(ctx, first...).Err(); err != nil {
						t.Fatal(err)
					}
					if err := rdb.Do(ctx, then...).Err(); err != nil {
						t.Fatal(err)
					}
				}
				if wi.By > 0 {
					// As the store does for a key it guessed had a TTL.
					if err := rdb.Do(ctx, wi.Expire()...).Err(); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				scripts++
				args := algorithms.AcquireArgs(l, cost, want, 0, nowMs)
				if charge {
					args = algorithms.ChargeArgs(l, cost, want, 0, nowMs)
				}
				reply, err := check.Run(ctx, rdb, algorithms.ScriptKeys(l, base, nowMs), args...).Result()
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if gotD, gotG, err = algorithms.DecodeAcquireReply(reply); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
			}
			if gotD != d || gotG != g {
				t.Fatalf("%s:\n model %+v %+v\n redis %+v %+v", where, d, g, gotD, gotG)
			}
		}
		lives := time.Duration(w+pm-now) * time.Millisecond
		if a == algorithms.SlidingWindowCounter {
			lives += p
		}
		ttl, err := rdb.PTTL(ctx, algorithms.WindowKey(prefix, pm, w)).Result()
		if err == nil && (ttl <= 0 || ttl > lives+time.Second) {
			t.Fatalf("sequence %d: the window's key has TTL %v, want the rest of the window", n, ttl)
		}
	}
	if plain == 0 || scripts == 0 || givenBack == 0 {
		t.Fatalf("%d plain checks, %d script calls, %d give-backs: the sequences missed a path", plain, scripts, givenBack)
	}
	requireTTLs(t, rdb)
}
