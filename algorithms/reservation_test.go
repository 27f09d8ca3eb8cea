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
