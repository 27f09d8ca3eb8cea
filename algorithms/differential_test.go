package algorithms_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
)

// The differential tests are deterministic by default. To explore other
// sequences: go test ./algorithms -run Differential -args -differential.seed=N
// (0 picks a seed from the clock; the seed in use is always logged).
var (
	differentialSeed      = flag.Uint64("differential.seed", 1, "seed of the differential tests' random limits and sequences; 0 picks one from the clock")
	differentialSequences = flag.Int("differential.sequences", 250, "random sequences per algorithm in TestDifferential")
)

// diffStartMs is about when the random sequences start, in ms since the epoch.
const diffStartMs = int64(1_700_000_000_000)

// maxDurationMs is the longest wait, in whole ms, that a time.Duration
// holds (about 292 years): decisions report longer waits as this.
const maxDurationMs = math.MaxInt64 / int64(time.Millisecond)

// diffStep is one check of a sequence: at nowMs, spend cost units of l.
type diffStep struct {
	l           algorithms.Limit
	nowMs, cost int64
}

// TestDifferential drives each algorithm's Go model and Lua script with the
// same random limits and (now, cost) sequences and requires identical
// decisions, and the TTLs docs/algorithms.md prescribes, at every step. See
// compareOnRedis for how keys expire.
func TestDifferential(t *testing.T) {
	rdb := startRedis(t)
	seed := seedFor(t)
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(a)))
			for n := range *differentialSequences {
				l := diffLimit(rng, a)
				where := fmt.Sprintf("seed %d, sequence %d, %+v", seed, n, l)
				steps, want, err := runModel(rng, []algorithms.Limit{l}, false)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				// Once with keys that never expire, so that every stale
				// state is read, once with keys expiring as in production.
				for _, expire := range []bool{false, true} {
					base := fmt.Sprintf("{test:diff:%d:%s:%d:%v}", seed, a, n, expire)
					compareOnRedis(t, rdb, fmt.Sprintf("%s, expire %v", where, expire), base, steps, want, expire)
				}
			}
		})
	}
	requireTTLs(t, rdb)
}

// TestDifferentialWindowClockBackwards is TestDifferential for the window
// algorithms with a clock that also steps backwards, as after a failover to
// a Redis whose clock is slower. Keys do not expire here: a state that
// expired before the clock stepped back is gone from a store but still in
// the model (docs/algorithms.md, "Clock going backwards").
func TestDifferentialWindowClockBackwards(t *testing.T) {
	rdb := startRedis(t)
	seed := seedFor(t)
	for _, a := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingWindowLog, algorithms.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1000+uint64(a)))
			for n := range *differentialSequences / 2 {
				l := diffLimit(rng, a)
				where := fmt.Sprintf("seed %d, sequence %d, %+v", seed, n, l)
				steps, want, err := runModel(rng, []algorithms.Limit{l}, true)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				base := fmt.Sprintf("{test:back:%d:%s:%d}", seed, a, n)
				compareOnRedis(t, rdb, where, base, steps, want, false)
			}
		})
	}
}

// TestDifferentialLimitChanges is TestDifferential with keys whose limit
// changes between checks (a policy reloaded with new values, or inline
// limits that differ): state written under one limit is read under another.
// Keys do not expire here: a TTL set under one limit may drop state that
// another would still count (docs/algorithms.md, "Expiry is garbage
// collection only"), in the stores and not in the model.
func TestDifferentialLimitChanges(t *testing.T) {
	rdb := startRedis(t)
	seed := seedFor(t)
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 3000+uint64(a)))
			for n := range *differentialSequences / 4 {
				limits := []algorithms.Limit{diffLimit(rng, a), diffLimit(rng, a), diffLimit(rng, a)}
				where := fmt.Sprintf("seed %d, sequence %d, limits %+v", seed, n, limits)
				steps, want, err := runModel(rng, limits, false)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				base := fmt.Sprintf("{test:change:%d:%s:%d}", seed, a, n)
				compareOnRedis(t, rdb, where, base, steps, want, false)
			}
		})
	}
}

// TestDifferentialWindowExamples replays the worked examples the model tests
// check (window_models_test.go) through the Lua scripts.
func TestDifferentialWindowExamples(t *testing.T) {
	rdb := startRedis(t)
	for i, ex := range algorithms.WindowExamples {
		t.Run(ex.Name, func(t *testing.T) {
			steps := make([]diffStep, len(ex.Steps))
			want := make([]algorithms.Decision, len(ex.Steps))
			for j, s := range ex.Steps {
				steps[j], want[j] = diffStep{ex.Limit, s.NowMs, s.Cost}, s.Want
			}
			for _, expire := range []bool{false, true} {
				base := fmt.Sprintf("{test:example:%d:%v}", i, expire)
				compareOnRedis(t, rdb, fmt.Sprintf("expire %v", expire), base, steps, want, expire)
			}
		})
	}
}

// TestDifferentialRedisTime checks that a script given no explicit now reads
// Redis TIME in milliseconds: its decision is the Go model's at some moment
// between a TIME taken before and one taken after, and a later check at an
// explicit now sees the state it wrote.
func TestDifferentialRedisTime(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			sc := redis.NewScript(algorithms.CheckScript(a))
			l := algorithms.Limit{Algorithm: a, Limit: 5, Period: time.Hour}
			keys := algorithms.Keys(a, "{test:time:"+a.String()+"}")

			before := redisNowMs(t, rdb)
			first, err := decodeRun(sc.Run(ctx, rdb, keys, algorithms.CheckArgs(l, 1, 0)...))
			if err != nil {
				t.Fatal(err)
			}
			after := redisNowMs(t, rdb)
			if !first.Allowed || first.Limit != 5 || first.Remaining != 4 || first.ResetAfter <= 0 || first.ResetAfter > 2*time.Hour {
				t.Fatalf("first check of 5/h with Redis TIME: %+v, want allowed with 4 remaining", first)
			}
			second, err := decodeRun(sc.Run(ctx, rdb, keys, algorithms.CheckArgs(l, 0, after)...))
			if err != nil {
				t.Fatal(err)
			}
			for now := before; now <= after; now++ {
				st := algorithms.NewState(a)
				d1, err := checkModel(st, l, now, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d2, _ := checkModel(st, l, after, 0); d1 == first && d2 == second {
					return
				}
			}
			t.Fatalf("Redis TIME was %d..%d ms; no now in that range gives the model the script's decisions %+v then (at %d, cost 0) %+v", before, after, first, after, second)
		})
	}
}

// TestDifferentialTTL runs each script as the Redis store does (EVALSHA,
// Redis TIME, real PEXPIRE) on long limits and checks after every check that
// no key is left without a TTL, and that a check admitting a positive cost
// leaves each of its keys a TTL of at most reset_after. (TestDifferential
// checks on every step that the TTL set is exactly reset_after.)
func TestDifferentialTTL(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	seed := seedFor(t)
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			sc := redis.NewScript(algorithms.CheckScript(a))
			rng := rand.New(rand.NewPCG(seed, 2000+uint64(a)))
			limits := []algorithms.Limit{
				{Algorithm: a, Limit: 5, Period: time.Hour},
				{Algorithm: a, Limit: 1000, Period: 24 * time.Hour},
			}
			for n, l := range limits {
				keys := algorithms.Keys(a, fmt.Sprintf("{test:ttl:%s:%d}", a, n))
				for i := range 30 {
					cost := diffCost(rng, l.Capacity())
					d, err := decodeRun(sc.Run(ctx, rdb, keys, algorithms.CheckArgs(l, cost, 0)...))
					if err != nil {
						t.Fatalf("%+v, check %d: %v", l, i, err)
					}
					for _, k := range keys {
						ttl, err := rdb.PTTL(ctx, k).Result()
						switch {
						case err != nil:
							t.Fatalf("PTTL %s: %v", k, err)
						case ttl == -1:
							t.Fatalf("%+v, check %d (cost %d, %+v): key %s has no TTL", l, i, cost, d, k)
						case d.Allowed && cost > 0 && d.ResetAfter > time.Minute && (ttl <= 0 || ttl > d.ResetAfter):
							// (A TTL of a few ms may run out before PTTL reads
							// it; these limits rarely set one.)
							t.Fatalf("%+v, check %d (cost %d, %+v): key %s has TTL %s, want (0, %s]", l, i, cost, d, k, ttl, d.ResetAfter)
						}
					}
				}
			}
		})
	}
	requireTTLs(t, rdb)
}

// requireTTLs fails the test for every key on the server without a TTL.
func requireTTLs(t *testing.T, rdb *redis.Client) {
	t.Helper()
	ctx := context.Background()
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, "*", 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if ttl, err := rdb.PTTL(ctx, k).Result(); err == nil && ttl == -1 {
				t.Errorf("key %s has no TTL", k)
			}
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// compareOnRedis replays steps, all of one algorithm, through its script on
// Redis, all in one call of sequenceDriver against keys under base, and
// fails the test at the first step whose decision differs from want, the Go
// model's, or whose writes break the TTL rule: a check that admits a
// positive cost sets each of its keys' TTL to max(1, reset_after) ms, any
// other check sets none, and no key is ever left without a TTL.
//
// Keys live by the simulated clock, not the server's (see sequenceDriver).
// Without expire they then live throughout, which checks that a stale state
// reads as what it is: correctness never depends on expiry. With expire
// each is deleted before the first step at which the TTL the script set has
// run out on the simulated clock: what a real Redis does, which checks that
// a missing key means the same as the state it replaced. The Go model keeps
// its state throughout.
func compareOnRedis(t *testing.T, rdb *redis.Client, where string, base string, steps []diffStep, want []algorithms.Decision, expire bool) {
	t.Helper()
	got, err := runSequence(rdb, base, steps, expire)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	keys := algorithms.Keys(steps[0].l.Algorithm, base)
	for i, s := range steps {
		if got[i].decision != want[i] {
			t.Fatalf("%s: step %d of %d: %+v, now %d, cost %d\n go model: %+v\n lua:      %+v\n%s",
				where, i, len(steps), s.l, s.nowMs, s.cost, want[i], got[i].decision, diffHistory(steps, want, i))
		}
		wantTTL := int64(-1)
		if want[i].Allowed && s.cost > 0 {
			wantTTL = max(1, want[i].ResetAfter.Milliseconds())
		}
		for j, k := range keys {
			ttl := got[i].ttlSet[j]
			// A reset_after past what a Duration holds is reported
			// saturated; the TTL is the exact wait.
			if saturated := wantTTL >= maxDurationMs; ttl != wantTTL && !(saturated && ttl > wantTTL) {
				t.Fatalf("%s: step %d (now %d, cost %d, %+v): key %s: the script set TTL %d ms, want %d (-1: none)\n%s",
					where, i, s.nowMs, s.cost, want[i], k, ttl, wantTTL, diffHistory(steps, want, i))
			}
			if got[i].hasNoTTL[j] {
				t.Fatalf("%s: step %d (now %d, cost %d, %+v): key %s is left without a TTL", where, i, s.nowMs, s.cost, want[i], k)
			}
		}
	}
}

// sequenceDriver runs a whole sequence of checks in one script call. It
// wraps a check script's exact source (at CHECK_SCRIPT) as a function that
// sees a redis table of its own: every call passes through, except that
// PEXPIRE records the TTL asked for and sets one hour instead. Without that,
// a key could expire on the server's clock between two steps that are
// simulated milliseconds apart; Redis 7.0 even deletes a key whose 1 ms TTL
// runs out within the PEXPIRE command itself. Expiry instead follows the
// simulated clock: with ARGV[1] = "expire", a key is deleted before the
// first step whose now has reached its write's now plus the TTL recorded.
//
// ARGV is "expire" or "keep", then 7 values per step (CheckArgs, with an
// explicit now). The reply has, per step, the check's 5 integers followed,
// for each key, by the TTL the step asked for (-1: none) and whether the key
// then exists without a TTL (1) or not (0).
const sequenceDriver = `local real, asked = redis, {}
local function intercept(call)
  return function(cmd, ...)
    if string.upper(cmd) == 'PEXPIRE' then
      local key, ttl = ...
      asked[key] = tonumber(ttl)
      return call('PEXPIRE', key, 3600000)
    end
    return call(cmd, ...)
  end
end
local shim = setmetatable({call = intercept(real.call), pcall = intercept(real.pcall)}, {__index = real})

local function check(KEYS, ARGV)
  local redis = shim
CHECK_SCRIPT
end

local expire, expires_at, out = ARGV[1] == 'expire', {}, {}
for i = 0, (#ARGV - 1) / 7 - 1 do
  local argv = {unpack(ARGV, 2 + i * 7, 8 + i * 7)}
  local now = tonumber(argv[7])
  for _, k in ipairs(KEYS) do
    if expire and expires_at[k] and now >= expires_at[k] then
      real.call('DEL', k)
      expires_at[k] = nil
    end
  end
  asked = {}
  local ok, reply = pcall(check, KEYS, argv)
  if not ok or type(reply) ~= 'table' then
    if type(reply) == 'table' then reply = reply.err end
    return real.error_reply('step ' .. i .. ': ' .. tostring(reply))
  end
  for _, k in ipairs(KEYS) do
    if asked[k] then expires_at[k] = now + asked[k] end
    reply[#reply + 1] = asked[k] or -1
    reply[#reply + 1] = real.call('PTTL', k) == -1 and 1 or 0
  end
  out[#out + 1] = reply
end
return out
`

// scriptResult is one step's outcome on Redis: the decision and, for each
// of the algorithm's keys, the TTL in ms the check set (-1: none) and
// whether the key was left without a TTL.
type scriptResult struct {
	decision algorithms.Decision
	ttlSet   []int64
	hasNoTTL []bool
}

// runSequence runs steps, all of one algorithm, through its script on Redis
// in one call of sequenceDriver, with keys expiring on the simulated clock
// when expire.
func runSequence(rdb *redis.Client, base string, steps []diffStep, expire bool) ([]scriptResult, error) {
	a := steps[0].l.Algorithm
	driver := redis.NewScript(strings.Replace(sequenceDriver, "CHECK_SCRIPT", algorithms.CheckScript(a), 1))
	keys := algorithms.Keys(a, base)
	mode := "keep"
	if expire {
		mode = "expire"
	}
	args := append(make([]any, 0, 1+7*len(steps)), mode)
	for _, s := range steps {
		args = append(args, algorithms.CheckArgs(s.l, s.cost, s.nowMs)...)
	}
	reply, err := driver.Run(context.Background(), rdb, keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("script: %w", err)
	}
	if len(reply) != len(steps) {
		return nil, fmt.Errorf("script: %d replies for %d steps", len(reply), len(steps))
	}
	results := make([]scriptResult, len(steps))
	for i, r := range reply {
		items, ok := r.([]any)
		if !ok || len(items) != 5+2*len(keys) {
			return nil, fmt.Errorf("step %d: reply %v, want the 5 integers and 2 per key", i, r)
		}
		d, err := algorithms.DecodeCheckReply(items[:5])
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", i, err)
		}
		results[i].decision = d
		for j := 5; j < len(items); j += 2 {
			ttl, _ := items[j].(int64)
			noTTL, _ := items[j+1].(int64)
			results[i].ttlSet = append(results[i].ttlSet, ttl)
			results[i].hasNoTTL = append(results[i].hasNoTTL, noTTL == 1)
		}
	}
	return results, nil
}

// diffHistory lists the steps before step i (at most 20) with the model's
// decisions, for a mismatch report.
func diffHistory(steps []diffStep, want []algorithms.Decision, i int) string {
	var b strings.Builder
	b.WriteString(" steps before it (now, +ms since the previous step, cost: model decision):\n")
	for j := max(0, i-20); j < i; j++ {
		delta := int64(0)
		if j > 0 {
			delta = steps[j].nowMs - steps[j-1].nowMs
		}
		fmt.Fprintf(&b, "  %d: %d %+d %d: %+v\n", j, steps[j].nowMs, delta, steps[j].cost, want[j])
		if j > 0 && steps[j].l != steps[j-1].l {
			fmt.Fprintf(&b, "     (limit now %+v)\n", steps[j].l)
		}
	}
	return b.String()
}

// runModel generates a random sequence and runs it through the Go model,
// returning the steps and the model's decisions. Steps use limits[0], or
// now and then another of limits (a key whose limit changed). The clock
// moves on from around diffStartMs, by jumps that favour the edges the last
// decision names; with backwards it sometimes steps back too. A panicking
// model (a placeholder) is an error.
func runModel(rng *rand.Rand, limits []algorithms.Limit, backwards bool) ([]diffStep, []algorithms.Decision, error) {
	st := algorithms.NewState(limits[0].Algorithm)
	now := diffStartMs + rng.Int64N(86_400_000)
	n := 1 + rng.IntN(100)
	steps := make([]diffStep, 0, n)
	decisions := make([]algorithms.Decision, 0, n)
	var last algorithms.Decision
	for range n {
		l := limits[0]
		if rng.IntN(4) == 0 {
			l = limits[rng.IntN(len(limits))]
		}
		p := l.PeriodMillis()
		now += diffJump(rng, p, now, last)
		if backwards && rng.IntN(10) == 0 {
			now -= rng.Int64N(2*p + 1)
		}
		s := diffStep{l, now, diffCost(rng, l.Capacity())}
		d, err := checkModel(st, l, s.nowMs, s.cost)
		if err != nil {
			return nil, nil, fmt.Errorf("step %d (now %d, cost %d): %w", len(steps), s.nowMs, s.cost, err)
		}
		steps, decisions, last = append(steps, s), append(decisions, d), d
	}
	return steps, decisions, nil
}

// checkModel runs the model, turning a panic into an error so that one
// unfinished model fails its own subtest, not the whole run.
func checkModel(st algorithms.State, l algorithms.Limit, nowMs, cost int64) (d algorithms.Decision, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("Go model panicked: %v", r)
		}
	}()
	return st.Check(l, nowMs, cost), nil
}

// diffLimit returns a valid limit of algorithm a: mostly small limits
// (where edges are hit often) but up to the bounds, periods from 1 ms to
// days, and for the buckets and GCRA a burst that is often not the limit.
func diffLimit(rng *rand.Rand, a algorithms.Algorithm) algorithms.Limit {
	for {
		l := algorithms.Limit{Algorithm: a, Limit: diffAmount(rng), Period: time.Duration(diffPeriodMs(rng)) * time.Millisecond}
		if a == algorithms.TokenBucket || a == algorithms.LeakyBucket || a == algorithms.GCRA {
			switch rng.IntN(4) {
			case 0: // the limit
			case 1:
				l.Burst = 1 + rng.Int64N(20)
			case 2:
				l.Burst = 1 + rng.Int64N(3*min(l.Limit, 1<<40))
			default:
				l.Burst = diffAmount(rng)
			}
		}
		if l.Validate() == nil {
			return l
		}
	}
}

func diffAmount(rng *rand.Rand) int64 {
	switch r := rng.IntN(20); {
	case r < 10:
		return 1 + rng.Int64N(20)
	case r < 15:
		return 21 + rng.Int64N(1000)
	case r < 18:
		return 1 + rng.Int64N(algorithms.MaxSlidingLogLimit)
	default:
		return 1 + rng.Int64N(1<<40)
	}
}

func diffPeriodMs(rng *rand.Rand) int64 {
	switch r := rng.IntN(20); {
	case r < 5:
		return 1 + rng.Int64N(10)
	case r < 9:
		return 11 + rng.Int64N(2000)
	case r < 13:
		return []int64{1000, 60_000, 3_600_000, 86_400_000}[rng.IntN(4)]
	case r < 19:
		return 1 + rng.Int64N(600_000)
	default:
		return 1 + rng.Int64N(algorithms.MaxPeriod.Milliseconds())
	}
}

// diffCost returns a cost from 0 to capacity, favouring 0, 1 and capacity.
func diffCost(rng *rand.Rand, capacity int64) int64 {
	switch r := rng.IntN(10); {
	case r < 1:
		return 0
	case r < 4:
		return 1
	case r < 5:
		return capacity
	case r < 7:
		return 1 + rng.Int64N(min(capacity, 5))
	default:
		return rng.Int64N(capacity + 1)
	}
}

// diffJump returns how far to advance the clock: often not at all, often onto
// the edges (a window boundary, the last decision's retry_after or
// reset_after, or one ms before them), sometimes by more than two periods.
func diffJump(rng *rand.Rand, p, now int64, last algorithms.Decision) int64 {
	switch r := rng.IntN(20); {
	case r < 6:
		return 0
	case r < 10:
		return 1 + rng.Int64N(max(1, p/10))
	case r < 12:
		return rng.Int64N(p + 1)
	case r < 14:
		return max(0, p-now%p+rng.Int64N(3)-1)
	case r < 16:
		return max(0, last.RetryAfter.Milliseconds()-rng.Int64N(2))
	case r < 17:
		return max(0, last.ResetAfter.Milliseconds()-rng.Int64N(2))
	case r < 19:
		return p + rng.Int64N(2*p+1)
	default:
		return 2*p + 1 + rng.Int64N(10*p)
	}
}

// decodeRun reads a script's reply into a Decision.
func decodeRun(cmd *redis.Cmd) (algorithms.Decision, error) {
	reply, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return algorithms.Decision{}, errors.New("script replied nil (is it still a placeholder?)")
	}
	if err != nil {
		return algorithms.Decision{}, fmt.Errorf("script: %w", err)
	}
	return algorithms.DecodeCheckReply(reply)
}

// startRedis starts a redis-server for the test and returns a client of it.
func startRedis(t *testing.T) *redis.Client {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// redisNowMs returns the server's TIME in whole milliseconds, as the
// scripts read it.
func redisNowMs(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMilli()
}

// seedFor returns the seed of this run and logs it.
func seedFor(t *testing.T) uint64 {
	t.Helper()
	seed := *differentialSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -args -differential.seed=%d)", seed, seed)
	return seed
}
