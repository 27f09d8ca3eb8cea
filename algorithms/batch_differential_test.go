package algorithms_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
)

// batchDriverShim runs a batch check script's exact source (at
// BATCH_SCRIPT) with a redis table whose PEXPIRE, and SET with PX, set one hour, so that no
// key expires on the server's clock between steps simulated milliseconds
// apart (see sequenceDriver); it replies what the batch script replies.
const batchDriverShim = `local real = redis
local shim = setmetatable({call = function(cmd, ...)
  local c = string.upper(cmd)
  if c == 'PEXPIRE' then
    local key = ...
    return real.call('PEXPIRE', key, 3600000)
  end
  local key, value, px = ...
  if c == 'SET' and px == 'PX' then
    return real.call('SET', key, value, 'PX', 3600000, select(5, ...))
  end
  return real.call(cmd, ...)
end}, {__index = real})

local function batch(KEYS, ARGV)
  local redis = shim
BATCH_SCRIPT
end
return batch(KEYS, ARGV)
`

// TestDifferentialBatch is TestDifferentialLeases through the batch check
// script: the same random sequences of acquires and releases (in every
// other sequence about half the acquires are charges, as in
// TestDifferentialCharges), the
// acquires between two releases decided in batches of random size (one
// batch script call each, several checks of one key in one call, each at
// its own explicit now), the releases by the release script; decisions,
// grants and returned units must match the Go model's step for step, and
// no key is ever left without a TTL. Keys do not expire here (their TTLs
// are TestDifferential's business: the batch runs the same check source).
func TestDifferentialBatch(t *testing.T) {
	rdb := startRedis(t)
	seed := seedFor(t)
	ctx := context.Background()
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 5000+uint64(a)))
			batchSrc := algorithms.BatchCheckScript(a)
			if batchSrc == "" {
				t.Fatal("no batch script")
			}
			batch := redis.NewScript(strings.Replace(batchDriverShim, "BATCH_SCRIPT", batchSrc, 1))
			release := redis.NewScript(algorithms.ReleaseScript(a))
			var batches, multi int
			for n := range *differentialSequences {
				limits := []algorithms.Limit{diffLimit(rng, a)}
				if n%2 == 1 {
					limits = append(limits, diffLimit(rng, a))
				}
				where := fmt.Sprintf("seed %d, sequence %d, limits %+v", seed, n, limits)
				// Keys do not expire here, so a window algorithm's clock
				// never steps back: its model forgets a window when its key
				// expires (see expires).
				backwards := n%3 == 2 && !algorithms.HasWindowKeys(a)
				steps, want, err := runModel(rng, limits, backwards, true, n%2 == 1)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				base := fmt.Sprintf("{test:batch:%d:%s:%d}", seed, a, n)
				keys := algorithms.Keys(a, base)
				for i := 0; i < len(steps); {
					s := steps[i]
					if s.release {
						reply, err := release.Run(ctx, rdb, keys, algorithms.ReleaseArgs(s.l, s.units, s.grant, s.nowMs)...).Result()
						if err != nil {
							t.Fatalf("%s: step %d (%s): release: %v", where, i, s, err)
						}
						got, err := algorithms.DecodeReleaseReply(reply)
						if err != nil || got != want[i].returned {
							t.Fatalf("%s: step %d (%s): returned %d (%v), model %d\n%s", where, i, s, got, err, want[i].returned, diffHistory(steps, want, i))
						}
						i++
						continue
					}
					// A batch of the acquires from i on, up to the next release.
					size := 1 + rng.IntN(min(12, algorithms.MaxBatchChecks))
					var bkeys []string
					var args []any
					j := i
					for ; j < len(steps) && j < i+size && !steps[j].release; j++ {
						st := steps[j]
						bkeys = append(bkeys, keys...)
						args = append(args, batchArgs(st)...)
					}
					reply, err := batch.Run(ctx, rdb, bkeys, args...).Result()
					if err != nil {
						t.Fatalf("%s: steps %d..%d: batch script: %v", where, i, j-1, err)
					}
					items, err := algorithms.SplitBatchReply(reply, j-i)
					if err != nil {
						t.Fatalf("%s: steps %d..%d: %v", where, i, j-1, err)
					}
					batches++
					if j-i > 1 {
						multi++
					}
					for k, item := range items {
						d, g, err := algorithms.DecodeAcquireReply(item)
						got := diffOutcome{decision: d, grant: g}
						if err != nil || got != want[i+k] {
							t.Fatalf("%s: step %d of %d (check %d of a batch of %d): %s (err %v)\n go model: %+v\n lua:      %+v\n%s",
								where, i+k, len(steps), k, j-i, steps[i+k], err, want[i+k], got, diffHistory(steps, want, i+k))
						}
					}
					i = j
				}
				for _, k := range keys {
					if ttl, err := rdb.PTTL(ctx, k).Result(); err != nil || ttl == -1 {
						t.Fatalf("%s: key %s left without a TTL (%v, %v)", where, k, ttl, err)
					}
				}
			}
			if multi == 0 {
				t.Errorf("no batch decided more than one check (%d batches)", batches)
			}
		})
	}
}

// TestBatchScriptOnRedisTime runs the batch script as production does,
// with Redis TIME: a batch of 40 checks on one fixed-window key of limit
// 10 admits exactly the first 10, and a check whose key holds another type
// fails alone, in its place, while the checks around it are decided.
func TestBatchScriptOnRedisTime(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	a := algorithms.FixedWindow
	l := algorithms.Limit{Algorithm: a, Limit: 10, Period: time.Hour}
	good := algorithms.Keys(a, "{test:batchtime:good}")
	bad := algorithms.Keys(a, "{test:batchtime:bad}")
	// The window's key of this hour and of the next, in case the hour
	// turns during the test.
	hour := time.Now().UnixMilli() / l.PeriodMillis() * l.PeriodMillis()
	for _, w := range []int64{hour, hour + l.PeriodMillis()} {
		if err := rdb.HSet(ctx, algorithms.WindowKey(bad[0], l.PeriodMillis(), w), "a", "hash").Err(); err != nil {
			t.Fatal(err)
		}
	}
	var keys []string
	var args []any
	for i := range 40 {
		if i == 5 {
			keys = append(keys, bad...)
		} else {
			keys = append(keys, good...)
		}
		args = append(args, algorithms.CheckArgs(l, 1, 0)...)
	}
	reply, err := redis.NewScript(algorithms.BatchCheckScript(a)).Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		t.Fatal(err)
	}
	items, err := algorithms.SplitBatchReply(reply, 40)
	if err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for i, item := range items {
		if i == 5 {
			if e, ok := item.(error); !ok || !strings.Contains(e.Error(), "WRONGTYPE") {
				t.Fatalf("check 5 (wrong type): got %v, want a WRONGTYPE error", item)
			}
			continue
		}
		d, err := algorithms.DecodeCheckReply(item)
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		if d.Allowed {
			allowed++
			if i > 10 {
				t.Fatalf("check %d allowed after the first 10", i)
			}
		}
	}
	if allowed != 10 {
		t.Fatalf("%d of 39 checks allowed, want 10", allowed)
	}
}

// batchArgs is the ARGV of step s, an acquire or a charge.
func batchArgs(s diffStep) []any {
	hold := time.Duration(s.holdMs) * time.Millisecond
	if s.charge {
		return algorithms.ChargeArgs(s.l, s.cost, s.want, hold, s.nowMs)
	}
	return algorithms.AcquireArgs(s.l, s.cost, s.want, hold, s.nowMs)
}
