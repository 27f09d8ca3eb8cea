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

// slotOp is one step on a concurrency limit: an acquire of cost under id,
// a renew or a release of id, at nowMs under l.
type slotOp struct {
	kind  byte // 'a' acquire, 'n' renew, 'r' release
	l     algorithms.Limit
	nowMs int64
	cost  int64
	id    string
}

func (o slotOp) String() string {
	switch o.kind {
	case 'a':
		return fmt.Sprintf("limit %d period %s, now %d: acquire cost %d id %q", o.l.Limit, o.l.Period, o.nowMs, o.cost, o.id)
	case 'n':
		return fmt.Sprintf("limit %d period %s, now %d: renew %q", o.l.Limit, o.l.Period, o.nowMs, o.id)
	}
	return fmt.Sprintf("limit %d period %s, now %d: release %q", o.l.Limit, o.l.Period, o.nowMs, o.id)
}

// slotOutcome is what a step gets: the decision and, for renew and
// release, whether the slot was held.
type slotOutcome struct {
	decision algorithms.Decision
	held     bool
}

func runSlotModel(st *algorithms.ConcurrencyState, o slotOp) slotOutcome {
	switch o.kind {
	case 'a':
		return slotOutcome{decision: st.Acquire(o.l, o.nowMs, o.cost, o.id)}
	case 'n':
		d, held := st.Renew(o.l, o.nowMs, o.id)
		return slotOutcome{d, held}
	}
	d, held := st.Release(o.l, o.nowMs, o.id)
	return slotOutcome{d, held}
}

// ConcurrencyExample is docs/algorithms.md's worked example of the
// concurrency algorithm: 2 slots living 10 s.
var concurrencyExample = func() []struct {
	op   slotOp
	want slotOutcome
} {
	l := algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 2, Period: 10 * time.Second}
	const t0 = int64(1_700_000_000_000)
	s := time.Second
	step := func(kind byte, at time.Duration, cost int64, id string, allowed bool, remaining int64, reset, retry time.Duration) struct {
		op   slotOp
		want slotOutcome
	} {
		d := algorithms.Decision{Allowed: allowed, Limit: 2, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
		return struct {
			op   slotOp
			want slotOutcome
		}{slotOp{kind, l, t0 + at.Milliseconds(), cost, id}, slotOutcome{d, kind != 'a' && allowed}}
	}
	return []struct {
		op   slotOp
		want slotOutcome
	}{
		step('a', 0, 1, "A", true, 1, 10*s, 0),                                           // A until 10 s
		step('a', 1*s, 1, "B", true, 0, 10*s, 0),                                         // B until 11 s
		step('a', 2*s, 1, "C", false, 0, 9*s, 8*s),                                       // full: A expires first, at 10 s
		step('a', 2*s, 0, "", false, 0, 9*s, 8*s),                                        // cost 0: is one free? no
		step('n', 3*s, 0, "A", true, 0, 10*s, 0),                                         // A renewed until 13 s
		step('r', 4*s, 0, "B", true, 1, 9*s, 0),                                          // B released
		step('r', 4*s, 0, "B", false, 1, 9*s, 0),                                         // B again: not held
		step('a', 5*s, 1, "C", true, 0, 10*s, 0),                                         // C until 15 s
		step('a', 13*s, 1, "D", true, 0, 10*s, 0),                                        // A expired at 13 s: its holder died
		step('n', 13*s+500*time.Millisecond, 0, "A", false, 0, 9500*time.Millisecond, 0), // too late
		step('r', 13*s+500*time.Millisecond, 0, "A", false, 0, 9500*time.Millisecond, 0), // also too late
		step('a', 24*s, 1, "E", true, 1, 10*s, 0),                                        // C and D expired
	}
}()

// TestConcurrencyExample checks the model against docs/algorithms.md's
// worked example.
func TestConcurrencyExample(t *testing.T) {
	var st algorithms.ConcurrencyState
	for i, s := range concurrencyExample {
		if got := runSlotModel(&st, s.op); got != s.want {
			t.Fatalf("step %d (%s):\n got  %+v\n want %+v", i, s.op, got, s.want)
		}
	}
}

// TestConcurrencyNeverOverLimit drives the model with random acquires,
// renews and releases of a fixed limit and checks its invariants: the live
// slots never exceed the limit, remaining is the limit minus the live
// slots, a release frees a slot once (a second release of the same id
// reports false), and a renew or release of an expired slot reports false.
func TestConcurrencyNeverOverLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for n := range 200 {
		l := algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1 + rng.Int64N(8), Period: time.Duration(1+rng.Int64N(50)) * time.Millisecond}
		var st algorithms.ConcurrencyState
		// expiry is the test's own record of each id's slot: 0 released.
		expiry := map[string]int64{}
		now := int64(1_000_000)
		for i := range 300 {
			now += rng.Int64N(5)
			id := fmt.Sprintf("s%d", rng.IntN(20))
			live := 0
			for _, e := range expiry {
				if e > now {
					live++
				}
			}
			switch rng.IntN(3) {
			case 0:
				d := st.Acquire(l, now, 1, id)
				if d.Allowed != (live+1 <= int(l.Limit)) {
					t.Fatalf("sequence %d step %d: acquire %q: %+v with %d live", n, i, id, d, live)
				}
				if d.Allowed {
					expiry[id] = max(expiry[id], now+l.PeriodMillis())
				}
			case 1:
				_, held := st.Renew(l, now, id)
				if held != (expiry[id] > now) {
					t.Fatalf("sequence %d step %d: renew %q held %v, test's record %d at %d", n, i, id, held, expiry[id], now)
				}
				if held {
					expiry[id] = max(expiry[id], now+l.PeriodMillis())
				}
			default:
				_, held := st.Release(l, now, id)
				if held != (expiry[id] > now) {
					t.Fatalf("sequence %d step %d: release %q held %v, test's record %d at %d", n, i, id, held, expiry[id], now)
				}
				if held {
					delete(expiry, id)
					if _, again := st.Release(l, now, id); again {
						t.Fatalf("sequence %d step %d: the second release of %q freed a slot", n, i, id)
					}
				}
			}
			live = 0
			for _, e := range expiry {
				if e > now {
					live++
				}
			}
			if live > int(l.Limit) {
				t.Fatalf("sequence %d step %d: %d slots live, limit %d", n, i, live, l.Limit)
			}
			if d := st.Acquire(l, now, 0, ""); d.Remaining != l.Limit-int64(live) {
				t.Fatalf("sequence %d step %d: remaining %d with %d live of %d", n, i, d.Remaining, live, l.Limit)
			}
		}
	}
}

// TestConcurrencyValidation: cost is 0 or 1, no burst, at most
// MaxConcurrencySlots slots.
func TestConcurrencyValidation(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 5, Period: time.Second}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, cost := range []int64{0, 1} {
		if err := l.ValidateCost(cost); err != nil {
			t.Errorf("cost %d: %v", cost, err)
		}
	}
	if err := l.ValidateCost(2); err == nil || !strings.Contains(err.Error(), "takes one slot") {
		t.Errorf("cost 2: %v, want an invalid cost", err)
	}
	bad := l
	bad.Burst = 3
	if err := bad.Validate(); err == nil {
		t.Error("a burst on a concurrency limit was accepted")
	}
	bad = l
	bad.Limit = algorithms.MaxConcurrencySlots + 1
	if err := bad.Validate(); err == nil {
		t.Error("a concurrency limit above MaxConcurrencySlots was accepted")
	}
	if a, err := algorithms.ParseAlgorithm("concurrency"); err != nil || a != algorithms.Concurrency {
		t.Errorf("ParseAlgorithm(concurrency) = %v, %v", a, err)
	}
}

// TestConcurrencyDifferential drives ConcurrencyState and the three
// concurrency scripts with the same random sequences (acquires under fresh
// and reused ids, renews and releases of held, released, expired and
// unknown ids; the clock jumping onto expiries, sometimes back; sometimes
// another limit) and requires identical decisions and held flags, and the
// TTL rule: a step that takes or renews a slot sets the key's TTL to
// reset_after, any other sets none, and the key is never left without one.
// Keys expire on the simulated clock or not at all, as in
// TestDifferential. The worked example is replayed first.
func TestConcurrencyDifferential(t *testing.T) {
	rdb := startRedis(t)
	t.Run("example", func(t *testing.T) {
		ops := make([]slotOp, len(concurrencyExample))
		want := make([]slotOutcome, len(concurrencyExample))
		for i, s := range concurrencyExample {
			ops[i], want[i] = s.op, s.want
		}
		compareSlotsOnRedis(t, rdb, "example", "{test:cc:example}", ops, want, true)
	})
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 5000))
	var taken, denied, renewed, released, missed int
	for n := range *differentialSequences {
		limits := []algorithms.Limit{diffSlotLimit(rng)}
		mode := []string{"keep", "expire", "limit changes", "clock backwards"}[n%4]
		if mode == "limit changes" {
			limits = append(limits, diffSlotLimit(rng), diffSlotLimit(rng))
		}
		ops, want := runSlotSequence(rng, limits, mode == "clock backwards")
		for i, o := range ops {
			switch {
			case o.kind == 'a' && want[i].decision.Allowed && o.cost > 0:
				taken++
			case o.kind == 'a' && !want[i].decision.Allowed:
				denied++
			case o.kind == 'n' && want[i].held:
				renewed++
			case o.kind == 'r' && want[i].held:
				released++
			case o.kind != 'a':
				missed++
			}
		}
		where := fmt.Sprintf("seed %d, sequence %d (%s), limits %+v", seed, n, mode, limits)
		compareSlotsOnRedis(t, rdb, where, fmt.Sprintf("{test:cc:%d:%d}", seed, n), ops, want, mode == "expire")
	}
	t.Logf("slots taken %d, denied %d, renewed %d, released %d, renews and releases of slots not held %d", taken, denied, renewed, released, missed)
	if taken == 0 || denied == 0 || renewed == 0 || released == 0 || missed == 0 {
		t.Errorf("the sequences did not exercise every outcome")
	}
	requireTTLs(t, rdb)
}

// diffSlotLimit is a random concurrency limit: mostly a few slots (so that
// limits are hit), periods from 1 ms to a day.
func diffSlotLimit(rng *rand.Rand) algorithms.Limit {
	l := algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1 + rng.Int64N(6), Period: time.Duration(diffPeriodMs(rng)) * time.Millisecond}
	if rng.IntN(10) == 0 {
		l.Limit = 1 + rng.Int64N(algorithms.MaxConcurrencySlots)
	}
	return l
}

// runSlotSequence generates a random sequence and runs it through the
// model.
func runSlotSequence(rng *rand.Rand, limits []algorithms.Limit, backwards bool) ([]slotOp, []slotOutcome) {
	var st algorithms.ConcurrencyState
	now := diffStartMs + rng.Int64N(86_400_000)
	n := 1 + rng.IntN(100)
	ops, outcomes := make([]slotOp, 0, n), make([]slotOutcome, 0, n)
	var ids []string // every id used so far
	var last algorithms.Decision
	for i := range n {
		l := limits[0]
		if rng.IntN(4) == 0 {
			l = limits[rng.IntN(len(limits))]
		}
		p := l.PeriodMillis()
		now += diffJump(rng, p, now, last)
		if backwards && rng.IntN(10) == 0 {
			now -= rng.Int64N(2*p + 1)
		}
		o := slotOp{l: l, nowMs: now}
		switch r := rng.IntN(10); {
		case r < 5 || len(ids) == 0:
			o.kind, o.cost, o.id = 'a', 1, fmt.Sprintf("slot-%d", i)
			switch rng.IntN(10) {
			case 0:
				o.cost, o.id = 0, ""
			case 1:
				if len(ids) > 0 {
					o.id = ids[rng.IntN(len(ids))]
				}
			}
		case r < 7:
			o.kind, o.id = 'n', ids[rng.IntN(len(ids))]
		default:
			o.kind, o.id = 'r', ids[rng.IntN(len(ids))]
		}
		if rng.IntN(20) == 0 && o.kind != 'a' {
			o.id = "never-taken"
		}
		out := runSlotModel(&st, o)
		if o.kind == 'a' {
			last = out.decision
			if o.id != "" {
				ids = append(ids, o.id)
			}
		}
		ops, outcomes = append(ops, o), append(outcomes, out)
	}
	return ops, outcomes
}

// slotDriver runs a whole sequence of concurrency steps in one script call,
// as sequenceDriver does for the rate algorithms (see there: PEXPIRE is
// recorded and replaced by one hour, and with ARGV[1] = "expire" the key
// is deleted once the simulated clock reaches the TTL asked for). ARGV
// then has 6 values per step: "a", "n" or "r", then SlotArgs with an
// explicit now. Per step the reply has the script's integers followed by
// the TTL the step asked for (-1: none) and whether the key then exists
// without a TTL (1) or not (0).
const slotDriver = `local real, asked = redis, {}
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

local scripts = {}
scripts.a = function(KEYS, ARGV)
  local redis = shim
ACQUIRE_SCRIPT
end
scripts.n = function(KEYS, ARGV)
  local redis = shim
RENEW_SCRIPT
end
scripts.r = function(KEYS, ARGV)
  local redis = shim
RELEASE_SCRIPT
end

local expire, expires_at, out = ARGV[1] == 'expire', {}, {}
local k = KEYS[1]
for i = 0, (#ARGV - 1) / 6 - 1 do
  local run = scripts[ARGV[2 + i * 6]]
  local argv = {unpack(ARGV, 3 + i * 6, 7 + i * 6)}
  local now = tonumber(argv[4])
  if expire and expires_at[k] and now >= expires_at[k] then
    real.call('DEL', k)
    expires_at[k] = nil
  end
  asked = {}
  local ok, reply = pcall(run, KEYS, argv)
  if not ok or type(reply) ~= 'table' then
    if type(reply) == 'table' then reply = reply.err end
    return real.error_reply('step ' .. i .. ': ' .. tostring(reply))
  end
  if asked[k] then expires_at[k] = now + asked[k] end
  reply[#reply + 1] = asked[k] or -1
  reply[#reply + 1] = real.call('PTTL', k) == -1 and 1 or 0
  out[#out + 1] = reply
end
return out
`

// compareSlotsOnRedis replays ops through the concurrency scripts on Redis
// in one call of slotDriver and fails the test at the first step whose
// outcome differs from want, the model's, or that breaks the TTL rule.
func compareSlotsOnRedis(t *testing.T, rdb *redis.Client, where, base string, ops []slotOp, want []slotOutcome, expire bool) {
	t.Helper()
	src := strings.Replace(slotDriver, "ACQUIRE_SCRIPT", algorithms.AcquireSlotScript(), 1)
	src = strings.Replace(src, "RENEW_SCRIPT", algorithms.RenewSlotScript(), 1)
	src = strings.Replace(src, "RELEASE_SCRIPT", algorithms.ReleaseSlotScript(), 1)
	mode := "keep"
	if expire {
		mode = "expire"
	}
	args := append(make([]any, 0, 1+6*len(ops)), mode)
	for _, o := range ops {
		args = append(append(args, string(o.kind)), algorithms.SlotArgs(o.l, o.id, o.cost, o.nowMs)...)
	}
	keys := algorithms.Keys(algorithms.Concurrency, base)
	reply, err := redis.NewScript(src).Run(context.Background(), rdb, keys, args...).Slice()
	if err != nil {
		t.Fatalf("%s: script: %v", where, err)
	}
	if len(reply) != len(ops) {
		t.Fatalf("%s: %d replies for %d steps", where, len(reply), len(ops))
	}
	for i, r := range reply {
		o := ops[i]
		n := 4
		if o.kind == 'a' {
			n = 5
		}
		items, ok := r.([]any)
		if !ok || len(items) != n+2 {
			t.Fatalf("%s: step %d: reply %v, want %d integers and 2 more", where, i, r, n)
		}
		var got slotOutcome
		if o.kind == 'a' {
			got.decision, err = algorithms.DecodeAcquireSlotReply(items[:n])
		} else {
			got.decision, got.held, err = algorithms.DecodeSlotReply(items[:n])
		}
		if err != nil {
			t.Fatalf("%s: step %d (%s): %v", where, i, o, err)
		}
		if got != want[i] {
			t.Fatalf("%s: step %d of %d: %s\n go model: %+v\n lua:      %+v\n%s", where, i, len(ops), o, want[i], got, slotHistory(ops, want, i))
		}
		wantTTL := int64(-1)
		if (o.kind == 'a' && o.cost > 0 && got.decision.Allowed) || (o.kind == 'n' && got.held) {
			wantTTL = max(1, want[i].decision.ResetAfter.Milliseconds())
		}
		if ttl, _ := items[n].(int64); ttl != wantTTL {
			t.Fatalf("%s: step %d (%s, %+v): the script set TTL %d ms, want %d (-1: none)\n%s", where, i, o, want[i], ttl, wantTTL, slotHistory(ops, want, i))
		}
		if noTTL, _ := items[n+1].(int64); noTTL == 1 {
			t.Fatalf("%s: step %d (%s): the key is left without a TTL", where, i, o)
		}
	}
}

// slotHistory lists the steps before step i (at most 20) with the model's
// outcomes, for a mismatch report.
func slotHistory(ops []slotOp, want []slotOutcome, i int) string {
	var b strings.Builder
	b.WriteString(" steps before it:\n")
	for j := max(0, i-20); j < i; j++ {
		fmt.Fprintf(&b, "  %d: %s: %+v\n", j, ops[j], want[j])
	}
	return b.String()
}
