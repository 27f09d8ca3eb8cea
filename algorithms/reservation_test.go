package algorithms_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
)

// TestDifferentialReservations runs random sequences of reservations,
// settles (retried ones, ones of ids never reserved, actuals below, at and
// above the estimate, past the capacity into debt) and plain checks, at an
// explicit clock that moves forward, through the reserve and settle
// scripts on a real redis-server and through the Go model
// (State.Acquire, Reservation.Settle): every reply must be the same.
func TestDifferentialReservations(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	seed := *differentialSeed
	t.Logf("seed %d", seed)
	seen := map[string]int{}
	for _, a := range algorithms.Algorithms() {
		reserve := redis.NewScript(withLongTTLs(algorithms.ReserveScript(a)))
		settle := redis.NewScript(withLongTTLs(algorithms.SettleScript(a)))
		check := redis.NewScript(withLongTTLs(algorithms.CheckScript(a)))
		for n := range 60 {
			rng := rand.New(rand.NewPCG(seed, uint64(a)<<32|uint64(n)))
			l := diffLimit(rng, a)
			base := fmt.Sprintf("{rv-%s-%d}", a, n)
			keys := algorithms.Keys(a, base)
			state := algorithms.NewState(a)
			held := map[string]*algorithms.Reservation{}
			var ids []string
			now := diffStartMs + rng.Int64N(l.PeriodMillis())
			most := min(3*l.Capacity(), l.MaxCharge())
			for i := range 40 {
				where := fmt.Sprintf("%s limit %+v sequence %d step %d", a, l, n, i)
				switch r := rng.IntN(10); {
				case r < 4:
					id := fmt.Sprint(i)
					est := rng.Int64N(l.Capacity() + 2)
					reply, err := reserve.Run(ctx, rdb, append(keys, algorithms.ReservationKey(base, id)), algorithms.ReserveArgs(l, est, time.Hour, now)...).Result()
					if err != nil {
						t.Fatalf("%s: reserve: %v", where, err)
					}
					gotD, gotG, err := algorithms.DecodeAcquireReply(reply)
					if err != nil {
						t.Fatalf("%s: reserve: %v", where, err)
					}
					wantD, wantG := state.Acquire(l, now, est, est, 0)
					if gotD != wantD || gotG != wantG {
						t.Fatalf("%s: reserve %d: script %+v %+v, model %+v %+v", where, est, gotD, gotG, wantD, wantG)
					}
					if wantD.Allowed && wantG.Units > 0 {
						held[id] = &algorithms.Reservation{Estimate: est, Grant: wantG}
					}
					ids = append(ids, id)
				case r < 8:
					id := "never"
					if len(ids) > 0 && rng.IntN(8) > 0 {
						id = ids[rng.IntN(len(ids))]
					}
					actual := rng.Int64N(most + 1)
					reply, err := settle.Run(ctx, rdb, append(keys, algorithms.ReservationKey(base, id)), algorithms.SettleArgs(l, actual, now)...).Result()
					if err != nil {
						t.Fatalf("%s: settle: %v", where, err)
					}
					got, err := algorithms.DecodeSettleReply(reply)
					if err != nil {
						t.Fatalf("%s: settle: %v", where, err)
					}
					var want algorithms.Settlement
					if rv := held[id]; rv != nil {
						want = rv.Settle(state, l, now, actual)
					} else {
						want = algorithms.Settlement{After: state.Check(l, now, 0)}
					}
					if got != want {
						t.Fatalf("%s: settle %s with %d: script %+v, model %+v", where, id, actual, got, want)
					}
					seen[got.Outcome.String()]++
					if got.Refunded > 0 {
						seen["refunded"]++
					}
					if got.Charged > 0 && !got.After.Allowed {
						seen["charged into debt"]++
					}
				default:
					cost := rng.Int64N(l.Capacity() + 1)
					got, err := decodeRun(check.Run(ctx, rdb, keys, algorithms.CheckArgs(l, cost, now)...))
					if err != nil {
						t.Fatalf("%s: check: %v", where, err)
					}
					if want := state.Check(l, now, cost); got != want {
						t.Fatalf("%s: check %d: script %+v, model %+v", where, cost, got, want)
					}
				}
				now += rng.Int64N(l.PeriodMillis()/3 + 1)
			}
		}
	}
	// The sequences must have reached every case, or they prove little.
	t.Logf("settles: %v", seen)
	for _, c := range []string{"settled", "settled before", "no reservation", "refunded", "charged into debt"} {
		if seen[c] < 20 {
			t.Errorf("only %d settles %s; the sequences should reach each case often", seen[c], c)
		}
	}
}

// withLongTTLs runs script src with every TTL it sets made an hour, so
// that no key expires on the server's clock while the simulated one moves
// by milliseconds: a state kept past its TTL is equivalent to a fresh one
// (State.Check), so decisions are unchanged.
func withLongTTLs(src string) string {
	return `local real = redis
local function intercept(call)
  return function(cmd, ...)
    local c = string.upper(cmd)
    if c == 'PEXPIRE' then
      local key = ...
      return call('PEXPIRE', key, 3600000)
    end
    local key, value, px = ...
    if c == 'SET' and px == 'PX' then
      return call('SET', key, value, 'PX', 3600000, select(5, ...))
    end
    return call(cmd, ...)
  end
end
local shim = setmetatable({call = intercept(real.call), pcall = intercept(real.pcall)}, {__index = real})
local function run(KEYS, ARGV)
  local redis = shim
` + src + `
end
return run(KEYS, ARGV)
`
}

// A reservation's record lives as long as the reservation: once its
// lifetime has passed, a settle finds nothing and changes nothing, so the
// estimate stays charged.
func TestSettleAfterTheLifetimeChangesNothing(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Hour}
	base := "{rv-life}"
	keys := append(algorithms.Keys(l.Algorithm, base), algorithms.ReservationKey(base, "x"))
	reply, err := redis.NewScript(algorithms.ReserveScript(l.Algorithm)).Run(ctx, rdb, keys, algorithms.ReserveArgs(l, 6, 30*time.Millisecond, 0)...).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d, _, err := algorithms.DecodeAcquireReply(reply); err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("reserve: %+v, %v", d, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Exists(ctx, keys[1]).Val() == 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	reply, err = redis.NewScript(algorithms.SettleScript(l.Algorithm)).Run(ctx, rdb, keys, algorithms.SettleArgs(l, 1, 0)...).Result()
	if err != nil {
		t.Fatal(err)
	}
	s, err := algorithms.DecodeSettleReply(reply)
	if err != nil || s.Outcome != algorithms.NoReservation || s.Refunded != 0 || s.After.Remaining != 4 {
		t.Fatalf("settle after the lifetime: %+v, %v; want no reservation, 4 remaining", s, err)
	}
}

// reservationExample is docs/algorithms.md's reservation example under one
// algorithm, 10 per 10 s at a window's start: reserve 6, settle it with 2,
// reserve 8, settle it with 15. refund is the first settle's refunded,
// remaining the key's remaining after it; retry the wait for one unit after
// the second settle's debt.
type reservationExample struct {
	refund, remaining int64
	retry             time.Duration
}

var reservationExamples = map[algorithms.Algorithm]reservationExample{
	algorithms.FixedWindow:          {4, 8, 10 * time.Second},
	algorithms.SlidingWindowLog:     {4, 8, 10 * time.Second},
	algorithms.SlidingWindowCounter: {4, 8, 14706 * time.Millisecond},
	algorithms.TokenBucket:          {4, 8, 8 * time.Second},
	algorithms.LeakyBucket:          {4, 8, 8 * time.Second},
	algorithms.GCRA:                 {4, 8, 8 * time.Second},
}

// TestReservationExamples replays the example through the Go model and
// the scripts (at the same explicit clock) and checks both against the
// table docs/algorithms.md shows.
func TestReservationExamples(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	const t0 = int64(1_700_000_040_000) // a multiple of 10 s
	for a, ex := range reservationExamples {
		t.Run(a.String(), func(t *testing.T) {
			l := algorithms.Limit{Algorithm: a, Limit: 10, Period: 10 * time.Second}
			base := "{rv-example-" + a.String() + "}"
			keys := algorithms.Keys(a, base)
			reserve := redis.NewScript(withLongTTLs(algorithms.ReserveScript(a)))
			settle := redis.NewScript(withLongTTLs(algorithms.SettleScript(a)))
			st := algorithms.NewState(a)
			var got [2]algorithms.Settlement
			for i, step := range []struct{ estimate, actual int64 }{{6, 2}, {8, 15}} {
				id := fmt.Sprint(i)
				d, g := st.Acquire(l, t0, step.estimate, step.estimate, 0)
				rv := algorithms.Reservation{Estimate: step.estimate, Grant: g}
				reply, err := reserve.Run(ctx, rdb, append(keys, algorithms.ReservationKey(base, id)), algorithms.ReserveArgs(l, step.estimate, time.Hour, t0)...).Result()
				if err != nil {
					t.Fatal(err)
				}
				if sd, _, err := algorithms.DecodeAcquireReply(reply); err != nil || sd != d || !d.Allowed {
					t.Fatalf("reserve %d: script %+v (%v), model %+v; want both admitted alike", step.estimate, sd, err, d)
				}
				got[i] = rv.Settle(st, l, t0, step.actual)
				reply, err = settle.Run(ctx, rdb, append(keys, algorithms.ReservationKey(base, id)), algorithms.SettleArgs(l, step.actual, t0)...).Result()
				if err != nil {
					t.Fatal(err)
				}
				if s, err := algorithms.DecodeSettleReply(reply); err != nil || s != got[i] {
					t.Fatalf("settle %d: script %+v (%v), model %+v", step.actual, s, err, got[i])
				}
			}
			if got[0].Refunded != ex.refund || got[0].After.Remaining != ex.remaining {
				t.Errorf("reserve 6, settle 2: refunded %d, remaining %d; the example says %d, %d", got[0].Refunded, got[0].After.Remaining, ex.refund, ex.remaining)
			}
			if s := got[1]; s.Charged != 7 || s.After.Allowed || s.After.Remaining != 0 || s.After.RetryAfter != ex.retry {
				t.Errorf("reserve 8, settle 15: %+v; the example says 7 charged, denied, retry after %s", s, ex.retry)
			}
		})
	}
}
