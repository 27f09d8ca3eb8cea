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

// diffStep is one step of a sequence at nowMs under l: a check of cost (an
// acquire of want units held holdMs; a plain check has want = cost and
// holdMs 0), or with release, giving back units of grant.
type diffStep struct {
	l            algorithms.Limit
	nowMs, cost  int64
	want, holdMs int64
	// charge counts cost even when it does not fit (State.Charge,
	// algorithms.ChargeArgs).
	charge  bool
	release bool
	units   int64
	grant   algorithms.Grant
}

// checkStep is a plain check of cost.
func checkStep(l algorithms.Limit, nowMs, cost int64) diffStep {
	return diffStep{l: l, nowMs: nowMs, cost: cost, want: cost}
}

// diffOutcome is what a step gets: a check's decision and grant, or a
// release's returned units.
type diffOutcome struct {
	decision algorithms.Decision
	grant    algorithms.Grant
	returned int64
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
				steps, want, err := runModel(rng, []algorithms.Limit{l}, false, false, false)
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
				steps, want, err := runModel(rng, []algorithms.Limit{l}, true, false, false)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				base := fmt.Sprintf("{test:back:%d:%s:%d}", seed, a, n)
				compareOnRedis(t, rdb, where, base, steps, want, expires(a, "clock backwards"))
			}
		})
	}
}

// expires reports whether keys expire in a sequence of algorithm a in mode
// ("keep", "expire", "limit changes" or "clock backwards"). A window
// algorithm's model forgets each window when Redis expires the window's
// key (the fixed window at its end, the sliding counter a period later):
// with a clock that steps back into an earlier window, its keys must
// expire as in production for the two to agree (docs/algorithms.md,
// "Clock going backwards").
func expires(a algorithms.Algorithm, mode string) bool {
	return mode == "expire" || (mode == "clock backwards" && algorithms.HasWindowKeys(a))
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
				steps, want, err := runModel(rng, limits, false, false, false)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				base := fmt.Sprintf("{test:change:%d:%s:%d}", seed, a, n)
				compareOnRedis(t, rdb, where, base, steps, want, false)
			}
		})
	}
}

// TestDifferentialLeases is TestDifferential with leases: random sequences
// that mix acquires (random want and hold) and releases of random parts of
// the grants taken, through each algorithm's Go model and its check and
// release scripts, requiring identical decisions, grants and returned
// units, and the TTL rules (a release sets none and never leaves a key
// without one). Keys expire as in production, or not at all; the limit
// changes between steps; the clock steps back (keys do not expire in the
// last two, as in TestDifferentialLimitChanges and
// TestDifferentialWindowClockBackwards).
func TestDifferentialLeases(t *testing.T) {
	rdb := startRedis(t)
	seed := seedFor(t)
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 4000+uint64(a)))
			// What the sequences exercised, so that a generator that stops
			// producing leases fails rather than passes vacuously.
			var extra, returned, partial int
			defer func() {
				t.Logf("grants beyond cost %d, releases that returned units %d (%d partly)", extra, returned, partial)
				if !t.Failed() && (extra == 0 || returned == 0 || partial == 0) {
					t.Errorf("the sequences took no lease beyond cost, or no release returned units")
				}
			}()
			for n := range *differentialSequences {
				limits := []algorithms.Limit{diffLimit(rng, a)}
				mode := []string{"keep", "expire", "limit changes", "clock backwards"}[n%4]
				if mode == "limit changes" {
					limits = append(limits, diffLimit(rng, a), diffLimit(rng, a))
				}
				where := fmt.Sprintf("seed %d, sequence %d (%s), limits %+v", seed, n, mode, limits)
				steps, want, err := runModel(rng, limits, mode == "clock backwards", true, false)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				for i, o := range want {
					switch {
					case o.grant.Units > steps[i].cost:
						extra++
					case o.returned > 0:
						returned++
						if o.returned < steps[i].grant.Units {
							partial++
						}
					}
				}
				base := fmt.Sprintf("{test:lease:%d:%s:%d}", seed, a, n)
				compareOnRedis(t, rdb, where, base, steps, want, expires(a, mode))
			}
		})
	}
	requireTTLs(t, rdb)
}

// TestDifferentialCharges is TestDifferential with checks that count
// (State.Charge): random sequences in which about half the checks count,
// some with costs above the capacity or of the most a key may owe, mixed
// with plain checks, leases and releases, through each algorithm's Go model
// and its scripts, requiring identical decisions, grants, returned units
// and TTLs (a charge writes, and sets the TTL of an admission). Keys are
// kept, expire as in production, meet other limits, or see the clock step
// back, as in TestDifferentialLeases.
func TestDifferentialCharges(t *testing.T) {
	rdb := startRedis(t)
	seed := seedFor(t)
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 6000+uint64(a)))
			// What the sequences exercised, so that a generator that stops
			// producing debts fails rather than passes vacuously.
			var debts, overCapacity, deniedAfterDebt int
			defer func() {
				t.Logf("charges into debt %d (above the capacity %d), plain checks denied by a debt %d", debts, overCapacity, deniedAfterDebt)
				if !t.Failed() && (debts == 0 || overCapacity == 0 || deniedAfterDebt == 0) {
					t.Errorf("the sequences recorded no debt, none above the capacity, or no debt denied a later check")
				}
			}()
			for n := range *differentialSequences {
				limits := []algorithms.Limit{diffLimit(rng, a)}
				mode := []string{"keep", "expire", "limit changes", "clock backwards"}[n%4]
				if mode == "limit changes" {
					limits = append(limits, diffLimit(rng, a), diffLimit(rng, a))
				}
				where := fmt.Sprintf("seed %d, sequence %d (%s), limits %+v", seed, n, mode, limits)
				steps, want, err := runModel(rng, limits, mode == "clock backwards", n%2 == 1, true)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				inDebt := false
				for i, s := range steps {
					switch {
					case s.release:
					case s.charge && !want[i].decision.Allowed && s.cost > 0:
						debts++
						inDebt = true
						if s.cost > s.l.Capacity() {
							overCapacity++
						}
					case !s.charge && inDebt && !want[i].decision.Allowed && s.cost <= want[i].decision.Limit/2:
						deniedAfterDebt++
						inDebt = false
					}
				}
				base := fmt.Sprintf("{test:charge:%d:%s:%d}", seed, a, n)
				compareOnRedis(t, rdb, where, base, steps, want, expires(a, mode))
			}
		})
	}
	requireTTLs(t, rdb)
}

// TestDifferentialWindowExamples replays the worked examples the model tests
// check (window_models_test.go) through the Lua scripts.
func TestDifferentialWindowExamples(t *testing.T) {
	rdb := startRedis(t)
	for i, ex := range algorithms.WindowExamples {
		t.Run(ex.Name, func(t *testing.T) {
			steps := make([]diffStep, len(ex.Steps))
			want := make([]diffOutcome, len(ex.Steps))
			st := algorithms.NewState(ex.Limit.Algorithm)
			for j, s := range ex.Steps {
				// The example names the decision; the model, the grant.
				steps[j] = checkStep(ex.Limit, s.NowMs, s.Cost)
				o, err := runModelStep(st, steps[j])
				if err != nil || o.decision != s.Want {
					t.Fatalf("step %d: the model decides %+v (%v), the example %+v", j, o.decision, err, s.Want)
				}
				want[j] = o
			}
			for _, expire := range []bool{false, true} {
				if !expire && algorithms.HasWindowKeys(ex.Limit.Algorithm) && clockGoesBack(steps) {
					continue // see expires
				}
				base := fmt.Sprintf("{test:example:%d:%v}", i, expire)
				compareOnRedis(t, rdb, fmt.Sprintf("expire %v", expire), base, steps, want, expire)
			}
		})
	}
}

// clockGoesBack reports whether a step of steps is earlier than the one
// before it.
func clockGoesBack(steps []diffStep) bool {
	for i := 1; i < len(steps); i++ {
		if steps[i].nowMs < steps[i-1].nowMs {
			return true
		}
	}
	return false
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
					stateKeys := keys
					if algorithms.HasWindowKeys(a) {
						// The windows' own keys, under the prefix.
						if stateKeys, err = rdb.Keys(ctx, keys[0]+":*").Result(); err != nil {
							t.Fatal(err)
						}
					}
					for _, k := range stateKeys {
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
//
// A step may also acquire a lease or release one (see diffStep): then the
// grant or the units returned must match the model's too, and a release sets
// no TTL and never leaves a key without one.
func compareOnRedis(t *testing.T, rdb *redis.Client, where string, base string, steps []diffStep, want []diffOutcome, expire bool) {
	t.Helper()
	got, err := runSequence(rdb, base, steps, expire)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	keys := algorithms.Keys(steps[0].l.Algorithm, base)
	for i, s := range steps {
		if got[i].outcome != want[i] {
			t.Fatalf("%s: step %d of %d: %s\n go model: %+v\n lua:      %+v\n%s",
				where, i, len(steps), s, want[i], got[i].outcome, diffHistory(steps, want, i))
		}
		wantTTL := int64(-1)
		// A check writes when it spends; a charge spends even when denied.
		if !s.release && (want[i].decision.Allowed || s.charge) && s.cost > 0 {
			wantTTL = max(1, want[i].decision.ResetAfter.Milliseconds())
		}
		for j, k := range keys {
			ttl := got[i].ttlSet[j]
			// A reset_after past what a Duration holds is reported
			// saturated; the TTL is the exact wait.
			if saturated := wantTTL >= maxDurationMs; ttl != wantTTL && !(saturated && ttl > wantTTL) {
				t.Fatalf("%s: step %d (%s, %+v): key %s: the script set TTL %d ms, want %d (-1: none)\n%s",
					where, i, s, want[i], k, ttl, wantTTL, diffHistory(steps, want, i))
			}
			if got[i].hasNoTTL[j] {
				t.Fatalf("%s: step %d (%s, %+v): key %s is left without a TTL", where, i, s, want[i], k)
			}
		}
	}
}

// sequenceDriver runs a whole sequence of checks and releases in one script
// call. It wraps a check script's exact source (at CHECK_SCRIPT) and a
// release script's (at RELEASE_SCRIPT) as functions that see a redis table
// of their own: every call passes through, except that PEXPIRE, and a SET
// with PX that writes, record the TTL asked for and set one hour instead. Without that, a key could expire
// on the server's clock between two steps that are simulated milliseconds
// apart; Redis 7.0 even deletes a key whose 1 ms TTL runs out within the
// PEXPIRE command itself. Expiry instead follows the simulated clock: with
// ARGV[1] = "expire", a key is deleted before the first step whose now has
// reached its write's now plus the TTL recorded.
//
// ARGV is "expire" or "keep", then 11 values per step: "c" (check) or "r"
// (release), then the 10 arguments (AcquireArgs or ChargeArgs; ReleaseArgs
// and a 0), with an explicit now. The reply has, per step, the script's
// integers (8 for a check, 1 for a release) followed, for each key, by the
// TTL the step asked
// for (-1: none) and whether the key then exists without a TTL (1) or not
// (0).
const sequenceDriver = `local real, asked = redis, {}
local function intercept(call)
  return function(cmd, ...)
    local c = string.upper(cmd)
    if c == 'PEXPIRE' then
      local key, ttl = ...
      asked[key] = tonumber(ttl)
      return call('PEXPIRE', key, 3600000)
    end
    local key, value, px, ttl, nx = ...
    if c == 'SET' and px == 'PX' then
      local reply = call('SET', key, value, 'PX', 3600000, select(5, ...))
      -- SET ... NX GET writes only a missing key, and then replies nil.
      if not (nx == 'NX' and reply) then asked[key] = tonumber(ttl) end
      return reply
    end
    return call(cmd, ...)
  end
end
local shim = setmetatable({call = intercept(real.call), pcall = intercept(real.pcall)}, {__index = real})

local function check(KEYS, ARGV)
  local redis = shim
CHECK_SCRIPT
end

local function release(KEYS, ARGV)
  local redis = shim
RELEASE_SCRIPT
end

local expire, expires_at, out = ARGV[1] == 'expire', {}, {}
for i = 0, (#ARGV - 1) / 11 - 1 do
  local run = check
  if ARGV[2 + i * 11] == 'r' then run = release end
  local argv = {unpack(ARGV, 3 + i * 11, 12 + i * 11)}
  local now = tonumber(argv[7])
  for k, at in pairs(expires_at) do
    if expire and now >= at then
      real.call('DEL', k)
      expires_at[k] = nil
    end
  end
  asked = {}
  local ok, reply = pcall(run, KEYS, argv)
  if not ok or type(reply) ~= 'table' then
    if type(reply) == 'table' then reply = reply.err end
    return real.error_reply('step ' .. i .. ': ' .. tostring(reply))
  end
  for _, k in ipairs(KEYS) do
    -- A fixed window's key is its window's: KEYS[1] is their prefix.
    local written = k
    if not asked[k] then
      for ak in pairs(asked) do
        if string.sub(ak, 1, #k + 1) == k .. ':' then written = ak end
      end
    end
    if asked[written] then expires_at[written] = now + asked[written] end
    reply[#reply + 1] = asked[written] or -1
    reply[#reply + 1] = real.call('PTTL', written) == -1 and 1 or 0
  end
  out[#out + 1] = reply
end
return out
`

// scriptResult is one step's outcome on Redis and, for each of the
// algorithm's keys, the TTL in ms the step set (-1: none) and whether the
// key was left without a TTL.
type scriptResult struct {
	outcome  diffOutcome
	ttlSet   []int64
	hasNoTTL []bool
}

// String describes the step for a failure message.
func (s diffStep) String() string {
	if s.release {
		return fmt.Sprintf("%+v, now %d, release %d of %+v", s.l, s.nowMs, s.units, s.grant)
	}
	verb := "cost"
	if s.charge {
		verb = "charge"
	}
	if s.want != s.cost || s.holdMs != 0 {
		return fmt.Sprintf("%+v, now %d, %s %d, want %d, hold %d ms", s.l, s.nowMs, verb, s.cost, s.want, s.holdMs)
	}
	return fmt.Sprintf("%+v, now %d, %s %d", s.l, s.nowMs, verb, s.cost)
}

// runSequence runs steps, all of one algorithm, through its scripts on
// Redis in one call of sequenceDriver, with keys expiring on the simulated
// clock when expire.
func runSequence(rdb *redis.Client, base string, steps []diffStep, expire bool) ([]scriptResult, error) {
	a := steps[0].l.Algorithm
	src := strings.Replace(sequenceDriver, "CHECK_SCRIPT", algorithms.CheckScript(a), 1)
	driver := redis.NewScript(strings.Replace(src, "RELEASE_SCRIPT", algorithms.ReleaseScript(a), 1))
	keys := algorithms.Keys(a, base)
	mode := "keep"
	if expire {
		mode = "expire"
	}
	args := append(make([]any, 0, 1+11*len(steps)), mode)
	for _, s := range steps {
		switch {
		case s.release:
			args = append(append(append(args, "r"), algorithms.ReleaseArgs(s.l, s.units, s.grant, s.nowMs)...), 0)
		case s.charge:
			hold := time.Duration(s.holdMs) * time.Millisecond
			args = append(append(args, "c"), algorithms.ChargeArgs(s.l, s.cost, s.want, hold, s.nowMs)...)
		default:
			hold := time.Duration(s.holdMs) * time.Millisecond
			args = append(append(args, "c"), algorithms.AcquireArgs(s.l, s.cost, s.want, hold, s.nowMs)...)
		}
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
		n := 8
		if steps[i].release {
			n = 1
		}
		items, ok := r.([]any)
		if !ok || len(items) != n+2*len(keys) {
			return nil, fmt.Errorf("step %d: reply %v, want the %d integers and 2 per key", i, r, n)
		}
		if steps[i].release {
			results[i].outcome.returned, err = algorithms.DecodeReleaseReply(items[:n])
		} else {
			results[i].outcome.decision, results[i].outcome.grant, err = algorithms.DecodeAcquireReply(items[:n])
		}
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", i, err)
		}
		for j := n; j < len(items); j += 2 {
			ttl, _ := items[j].(int64)
			noTTL, _ := items[j+1].(int64)
			results[i].ttlSet = append(results[i].ttlSet, ttl)
			results[i].hasNoTTL = append(results[i].hasNoTTL, noTTL == 1)
		}
	}
	return results, nil
}

// diffHistory lists the steps before step i (at most 20) with the model's
// outcomes, for a mismatch report.
func diffHistory(steps []diffStep, want []diffOutcome, i int) string {
	var b strings.Builder
	b.WriteString(" steps before it (+ms since the previous step, step: model outcome):\n")
	for j := max(0, i-20); j < i; j++ {
		delta := int64(0)
		if j > 0 {
			delta = steps[j].nowMs - steps[j-1].nowMs
		}
		fmt.Fprintf(&b, "  %d: %+d %s: %+v\n", j, delta, steps[j], want[j])
	}
	return b.String()
}

// runModel generates a random sequence and runs it through the Go model,
// returning the steps and the model's outcomes. Steps use limits[0], or
// now and then another of limits (a key whose limit changed). The clock
// moves on from around diffStartMs, by jumps that favour the edges the last
// decision names; with backwards it sometimes steps back too. With leases
// checks take random leases (want and hold) and releases give back random
// parts of the grants taken (see leaseStep); without, a fixed window's
// checks are now and then charges. With charges about half the checks of
// any algorithm are charges (see chargeStep). A panicking model (a
// placeholder) is an error.
func runModel(rng *rand.Rand, limits []algorithms.Limit, backwards, leases, charges bool) ([]diffStep, []diffOutcome, error) {
	st := algorithms.NewState(limits[0].Algorithm)
	now := diffStartMs + rng.Int64N(86_400_000)
	n := 1 + rng.IntN(100)
	steps := make([]diffStep, 0, n)
	outcomes := make([]diffOutcome, 0, n)
	var last algorithms.Decision
	var grants []algorithms.Grant
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
		s := checkStep(l, now, diffCost(rng, l.Capacity()))
		if leases {
			s, grants = leaseStep(rng, s, grants)
		} else if l.Algorithm == algorithms.FixedWindow && rng.IntN(4) == 0 {
			// A charge, often of more than the window has left or holds.
			s.charge, s.cost = true, rng.Int64N(3*l.Capacity()+1)
			s.want = s.cost
		}
		if charges && !s.release {
			s = chargeStep(rng, s)
		}
		o, err := runModelStep(st, s)
		if err != nil {
			return nil, nil, fmt.Errorf("step %d (%s): %w", len(steps), s, err)
		}
		if !s.release {
			last = o.decision
			if o.grant.Units > 0 {
				grants = append(grants, o.grant)
			}
		}
		steps, outcomes = append(steps, s), append(outcomes, o)
	}
	return steps, outcomes, nil
}

// leaseStep turns s, a random check, into a random lease step: now and then
// a release of part, all or (clamped) more of a grant taken before, usually
// once, sometimes again, sometimes with a Ref that names another window or
// entry; otherwise an acquire of want from cost to past the capacity, held
// for no time, a few ms or up to two periods. It returns the grants still
// outstanding.
func leaseStep(rng *rand.Rand, s diffStep, grants []algorithms.Grant) (diffStep, []algorithms.Grant) {
	capacity, p := s.l.Capacity(), s.l.PeriodMillis()
	if len(grants) > 0 && rng.IntN(3) == 0 {
		i := rng.IntN(len(grants))
		g := grants[i]
		if rng.IntN(5) > 0 {
			grants = append(grants[:i], grants[i+1:]...)
		}
		var units int64
		switch r := rng.IntN(10); {
		case r < 3:
			units = g.Units
		case r < 4:
			units = g.Units + 1 + rng.Int64N(3)
		case r < 5:
			units = rng.Int64N(2)
		default:
			units = rng.Int64N(g.Units + 1)
		}
		if rng.IntN(10) == 0 {
			g.Ref += []int64{-1, 1, p, -p}[rng.IntN(4)]
		}
		return diffStep{l: s.l, nowMs: s.nowMs, release: true, units: units, grant: g}, grants
	}
	switch r := rng.IntN(10); {
	case r < 2:
	case r < 3:
		s.want = capacity + rng.Int64N(3)
	default:
		s.want = s.cost + rng.Int64N(capacity-s.cost+1)
	}
	switch r := rng.IntN(10); {
	case r < 3:
	case r < 5:
		s.holdMs = 1 + rng.Int64N(3)
	default:
		s.holdMs = 1 + rng.Int64N(2*p)
	}
	return s, grants
}

// chargeStep makes s, a random check, count about half the time, with a
// cost that is now and then above the capacity: a little, a few times, or
// the most the limit may be charged (MaxCharge, which a key then saturates
// at).
func chargeStep(rng *rand.Rand, s diffStep) diffStep {
	if rng.IntN(2) == 0 {
		return s
	}
	s.charge = true
	capacity, most := s.l.Capacity(), s.l.MaxCharge()
	switch r := rng.IntN(20); {
	case r < 4:
		s.cost = min(most, capacity+1+rng.Int64N(3))
	case r < 6:
		s.cost = min(most, capacity*(2+rng.Int64N(3)))
	case r < 7:
		s.cost = most
	}
	s.want = max(s.want, s.cost)
	return s
}

// runModelStep runs one step through the model, turning a panic into an
// error so that one unfinished model fails its own subtest, not the whole
// run.
func runModelStep(st algorithms.State, s diffStep) (o diffOutcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("Go model panicked: %v", r)
		}
	}()
	switch {
	case s.release:
		o.returned = st.Release(s.l, s.nowMs, s.units, s.grant)
	case s.charge:
		o.decision, o.grant = st.Charge(s.l, s.nowMs, s.cost, s.want, s.holdMs)
	default:
		o.decision, o.grant = st.Acquire(s.l, s.nowMs, s.cost, s.want, s.holdMs)
	}
	return o, nil
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
