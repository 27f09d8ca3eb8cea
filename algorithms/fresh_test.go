package algorithms_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
)

// freshTimeField is the field of each fresh-writable state that is a time
// (1-based, as scripts/prelude.lua's parse takes it).
var freshTimeField = map[algorithms.Algorithm]int{
	algorithms.TokenBucket: 3,
	algorithms.LeakyBucket: 3,
	algorithms.GCRA:        1,
}

// TestFreshWriteMatchesTheScript requires that a fresh write (Fresh, then
// a plain SET ... NX) decides what the check script decides on a
// missing key, and that the state it writes, read back by the scripts,
// decides every later check and release exactly as the state the script
// would have written at the same time.
func TestFreshWriteMatchesTheScript(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	seed := seedFor(t)
	for a, tf := range freshTimeField {
		t.Run(a.String(), func(t *testing.T) {
			check := redis.NewScript(algorithms.CheckScript(a))
			// The check script, then a GET of the state it wrote, in one
			// script: a TTL of a few ms must not expire the state before it
			// is read (Redis freezes keys' expiry during a script).
			checkAndGet := redis.NewScript("local function check()\n" + algorithms.CheckScript(a) +
				"\nend\nlocal reply = check()\nreturn {reply, redis.call('GET', KEYS[1])}")
			release := redis.NewScript(algorithms.ReleaseScript(a))
			rng := rand.New(rand.NewPCG(seed, uint64(a)))
			compared := 0
			for n := range 400 {
				l := diffLimit(rng, a)
				cost := diffCost(rng, l.Capacity())
				want := cost + rng.Int64N(max(1, l.Capacity()))
				where := fmt.Sprintf("seed %d, case %d, %+v, cost %d, want %d", seed, n, l, cost, want)
				w, ok := algorithms.Fresh(l, cost, want)
				if wantOK := cost > 0 && cost <= l.Capacity(); ok != wantOK {
					t.Fatalf("%s: Fresh ok %v, want %v", where, ok, wantOK)
				}
				if !ok {
					continue
				}

				// The script on a missing key, at a clock of its own.
				scripted := fmt.Sprintf("{fresh:%d:%d}s", seed, n)
				nowMs := redisNowMs(t, rdb)
				both, err := checkAndGet.Run(ctx, rdb, algorithms.Keys(a, scripted), algorithms.AcquireArgs(l, cost, want, 0, nowMs)...).Slice()
				if err != nil || len(both) != 2 {
					t.Fatalf("%s: script: %v %v", where, both, err)
				}
				raw, _ := both[0].([]any)
				stored, _ := both[1].(string)
				d, g, err := algorithms.DecodeAcquireReply(raw)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if d != w.Decision || g != w.Grant {
					t.Fatalf("%s: Fresh decided %+v %+v, the script %+v %+v", where, w.Decision, w.Grant, d, g)
				}
				if ttl := max(raw[3].(int64), 1); ttl != w.TTLMillis {
					t.Fatalf("%s: Fresh TTL %d ms, the script's %d ms", where, w.TTLMillis, ttl)
				}
				if got := absolute(t, w.Value, tf, nowMs); got != stored {
					t.Fatalf("%s: Fresh writes %q (%q at %d), the script %q", where, w.Value, got, nowMs, stored)
				}

				// Later steps read both states alike. Only states that live
				// well beyond this test's own few ms are compared: both keys
				// expire on Redis's clock, not on the simulated one.
				if w.TTLMillis < 10_000 {
					continue
				}
				compared++
				plain := fmt.Sprintf("{fresh:%d:%d}p", seed, n)
				key := algorithms.Keys(a, plain)[0]
				before := redisNowMs(t, rdb)
				// (Not SetNX: its Duration overflows on a TTL of centuries.)
				if reply, err := rdb.Do(ctx, "SET", key, w.Value, "PX", w.TTLMillis, "NX").Result(); reply != "OK" || err != nil {
					t.Fatalf("%s: SET NX on a missing key: %v, %v", where, reply, err)
				}
				// (go-redis's PExpireTime returns a Duration, which a TTL of
				// centuries overflows.)
				expireMs, err := rdb.Do(ctx, "PEXPIRETIME", key).Int64()
				if err != nil {
					t.Fatalf("%s: PEXPIRETIME: %v", where, err)
				}
				writtenMs := expireMs - w.TTLMillis
				// The write's time, as the scripts recover it, is Redis's
				// clock at the SET, as TIME would have read it.
				if after := redisNowMs(t, rdb); writtenMs < before || writtenMs > after {
					t.Fatalf("%s: the fresh write's time reads as %d, outside Redis TIME %d..%d around the SET", where, writtenMs, before, after)
				}
				rescripted := fmt.Sprintf("{fresh:%d:%d}r", seed, n)
				if err := check.Run(ctx, rdb, algorithms.Keys(a, rescripted), algorithms.AcquireArgs(l, cost, want, 0, writtenMs)...).Err(); err != nil {
					t.Fatalf("%s: script: %v", where, err)
				}
				at := writtenMs
				for step := range 4 {
					at += diffJump(rng, l.PeriodMillis(), at, w.Decision)
					var args []any
					sc := check
					// Half the cases read the fresh state with a release first.
					if (step+n)%2 == 1 {
						sc = release
						args = algorithms.ReleaseArgs(l, 1+rng.Int64N(w.Grant.Units), w.Grant, at)
					} else {
						c := diffCost(rng, l.Capacity())
						args = algorithms.AcquireArgs(l, c, max(c, want), 0, at)
					}
					fromFresh, err1 := sc.Run(ctx, rdb, algorithms.Keys(a, plain), args...).Slice()
					fromScript, err2 := sc.Run(ctx, rdb, algorithms.Keys(a, rescripted), args...).Slice()
					if err1 != nil || err2 != nil {
						t.Fatalf("%s, step %d at +%d ms: %v / %v", where, step, at-writtenMs, err1, err2)
					}
					if fmt.Sprint(fromFresh) != fmt.Sprint(fromScript) {
						t.Fatalf("%s, step %d at +%d ms: the fresh write's state replied %v, the script's %v", where, step, at-writtenMs, fromFresh, fromScript)
					}
				}
			}
			if compared < 20 {
				t.Fatalf("only %d cases lived long enough to compare later steps", compared)
			}
			t.Logf("%d cases compared beyond the first check", compared)
		})
	}
}

// absolute returns a fresh write's value as the script would have stored
// it at nowMs: the "r<ttl> " prefix dropped and field tf made absolute.
func absolute(t *testing.T, v string, tf int, nowMs int64) string {
	t.Helper()
	_, rest, ok := strings.Cut(v, " ")
	if !strings.HasPrefix(v, "r") || !ok {
		t.Fatalf("fresh value %q is not r<ttl> then the fields", v)
	}
	fields := strings.Fields(rest)
	offset, err := strconv.ParseInt(fields[tf-1], 10, 64)
	if err != nil {
		t.Fatalf("fresh value %q: %v", v, err)
	}
	fields[tf-1] = strconv.FormatInt(nowMs+offset, 10)
	return strings.Join(fields, " ")
}

// TestFreshWriteRejectsMalformedValues requires that a script reading a
// fresh-form value refuses one of the wrong shape, or one under an
// algorithm that never writes that form, instead of misreading it.
func TestFreshWriteRejectsMalformedValues(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	for _, c := range []struct {
		a     algorithms.Algorithm
		value string
		ttl   time.Duration
	}{
		{algorithms.TokenBucket, "r100 1 2", time.Minute}, // two fields of three
		{algorithms.TokenBucket, "r 1 2 3", time.Minute},  // no TTL
		{algorithms.GCRA, "rx 1 2", time.Minute},          // a TTL that is no number
		{algorithms.LeakyBucket, "r100 1 2 3", 0},         // no expire time to read the write's time from
	} {
		key := algorithms.Keys(c.a, "{fresh:bad}")[0]
		if err := rdb.Set(ctx, key, c.value, c.ttl).Err(); err != nil {
			t.Fatal(err)
		}
		l := algorithms.Limit{Algorithm: c.a, Limit: 10, Period: time.Minute}
		err := redis.NewScript(algorithms.CheckScript(c.a)).Run(ctx, rdb, algorithms.Keys(c.a, "{fresh:bad}"), algorithms.CheckArgs(l, 1, 0)...).Err()
		if err == nil || !strings.Contains(err.Error(), "malformed state") {
			t.Errorf("%s reading %q: %v, want a malformed state error", c.a, c.value, err)
		}
		if err := rdb.Del(ctx, key).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFreshLogWriteMatchesTheScript requires that a sliding log's fresh
// write (Fresh: its one entry in the meta key alone, SET ... NX) decides
// what the check script decides on a missing key, and that the scripts,
// reading it, decide every later check, lease, charge and release exactly
// as on the state the script would have written at the write's time, with
// the clock going forward past the entry's expiry and back.
func TestFreshLogWriteMatchesTheScript(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	seed := seedFor(t)
	a := algorithms.SlidingWindowLog
	check := redis.NewScript(algorithms.CheckScript(a))
	release := redis.NewScript(algorithms.ReleaseScript(a))
	rng := rand.New(rand.NewPCG(seed, uint64(a)))
	compared := 0
	for n := range 300 {
		l := diffLimit(rng, a)
		cost := diffCost(rng, l.Capacity())
		where := fmt.Sprintf("seed %d, case %d, %+v, cost %d", seed, n, l, cost)
		w, ok := algorithms.Fresh(l, cost, cost+rng.Int64N(5))
		if wantOK := cost > 0 && cost <= l.Capacity(); ok != wantOK {
			t.Fatalf("%s: Fresh ok %v, want %v", where, ok, wantOK)
		}
		if !ok || l.PeriodMillis() < 10_000 {
			continue
		}
		compared++
		fresh := algorithms.Keys(a, fmt.Sprintf("{freshl:%d:%d}f", seed, n))
		if reply, err := rdb.Do(ctx, "SET", algorithms.FreshKey(a, fresh), w.Value, "PX", w.TTLMillis, "NX").Result(); reply != "OK" || err != nil {
			t.Fatalf("%s: SET NX on a missing key: %v, %v", where, reply, err)
		}
		expireMs, err := rdb.Do(ctx, "PEXPIRETIME", algorithms.FreshKey(a, fresh)).Int64()
		if err != nil {
			t.Fatalf("%s: PEXPIRETIME: %v", where, err)
		}
		writtenMs := expireMs - w.TTLMillis
		scripted := algorithms.Keys(a, fmt.Sprintf("{freshl:%d:%d}s", seed, n))
		sd, sg, err := algorithms.DecodeAcquireReply(check.Run(ctx, rdb, scripted, algorithms.CheckArgs(l, cost, writtenMs)...).Val())
		if err != nil || sd != w.Decision || sg != w.Grant {
			t.Fatalf("%s: the fresh write decides %+v %+v, the script %+v %+v (%v)", where, w.Decision, w.Grant, sd, sg, err)
		}
		at := writtenMs
		for step := range 4 {
			at += diffJump(rng, l.PeriodMillis(), at, w.Decision)
			if rng.IntN(8) == 0 { // the clock steps back, never before the write
				at = max(writtenMs, at-rng.Int64N(2*l.PeriodMillis()))
			}
			sc, args := check, []any(nil)
			if (step+n)%2 == 1 {
				sc = release
				args = algorithms.ReleaseArgs(l, 1+rng.Int64N(w.Grant.Units), w.Grant, at)
			} else {
				c := diffCost(rng, l.Capacity())
				switch rng.IntN(3) {
				case 0:
					args = algorithms.CheckArgs(l, c, at)
				case 1: // a lease, held for up to a period
					hold := time.Duration(rng.Int64N(l.PeriodMillis()+1)) * time.Millisecond
					args = algorithms.AcquireArgs(l, c, c+rng.Int64N(l.Capacity()-c+1), hold, at)
				default: // a charge, which counts even what does not fit
					args = algorithms.ChargeArgs(l, c+rng.Int64N(3), c, 0, at)
				}
			}
			fromFresh, err1 := sc.Run(ctx, rdb, fresh, args...).Slice()
			fromScript, err2 := sc.Run(ctx, rdb, scripted, args...).Slice()
			if err1 != nil || err2 != nil {
				t.Fatalf("%s, step %d at +%d ms: %v / %v", where, step, at-writtenMs, err1, err2)
			}
			if fmt.Sprint(fromFresh) != fmt.Sprint(fromScript) {
				t.Fatalf("%s, step %d at +%d ms: the fresh write's state replied %v, the script's %v", where, step, at-writtenMs, fromFresh, fromScript)
			}
		}
	}
	if compared < 20 {
		t.Fatalf("only %d cases lived long enough to compare", compared)
	}
	t.Logf("%d cases compared", compared)
}

// TestFreshLogIsWrittenOnlyWhenTheCheckWrites requires that the check
// script reads a sliding log's fresh form where it is: a denial and a
// cost-0 check leave the meta key's value and TTL as they were and create
// no log, and the next admitted check writes the fresh entry and its own
// into the log, at their times.
func TestFreshLogIsWrittenOnlyWhenTheCheckWrites(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	a := algorithms.SlidingWindowLog
	check := redis.NewScript(algorithms.CheckScript(a))
	l := algorithms.Limit{Algorithm: a, Limit: 2, Period: time.Minute}
	w, ok := algorithms.Fresh(l, 2, 2)
	if !ok {
		t.Fatal("Fresh refused a check of the whole limit")
	}
	keys := algorithms.Keys(a, "{freshonly}")
	logKey, meta := keys[0], keys[1]
	if err := rdb.Do(ctx, "SET", meta, w.Value, "PX", w.TTLMillis, "NX").Err(); err != nil {
		t.Fatal(err)
	}
	expireMs := rdb.Do(ctx, "PEXPIRETIME", meta).Val().(int64)
	writtenMs := expireMs - w.TTLMillis
	for _, c := range []struct {
		name string
		cost int64
	}{{"a denial", 1}, {"a cost-0 check", 0}} {
		d, _, err := algorithms.DecodeAcquireReply(check.Run(ctx, rdb, keys, algorithms.CheckArgs(l, c.cost, writtenMs+1000)...).Val())
		if err != nil || d.Allowed || d.Remaining != 0 {
			t.Fatalf("%s on the full fresh log: %+v, %v", c.name, d, err)
		}
		if v := rdb.Get(ctx, meta).Val(); v != w.Value {
			t.Fatalf("%s rewrote the fresh form %q as %q", c.name, w.Value, v)
		}
		if exp := rdb.Do(ctx, "PEXPIRETIME", meta).Val().(int64); exp != expireMs {
			t.Fatalf("%s moved the meta key's expiry from %d to %d", c.name, expireMs, exp)
		}
		if n := rdb.Exists(ctx, logKey).Val(); n != 0 {
			t.Fatalf("%s created the log", c.name)
		}
	}
	// A period later the fresh entry has expired: an admitted check drops it.
	at := writtenMs + l.PeriodMillis()
	d, _, err := algorithms.DecodeAcquireReply(check.Run(ctx, rdb, keys, algorithms.CheckArgs(l, 1, at)...).Val())
	if err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("a check once the fresh entry expired: %+v, %v", d, err)
	}
	entries := rdb.ZRangeWithScores(ctx, logKey, 0, -1).Val()
	if len(entries) != 1 || entries[0].Score != float64(at) || entries[0].Member != "1:1" {
		t.Fatalf("the log after the fresh entry expired: %v, want only the check's entry 1:1 at %d", entries, at)
	}

	// A fresh entry that still counts goes into the log beside the check's.
	keys = algorithms.Keys(a, "{freshkept}")
	w, _ = algorithms.Fresh(l, 1, 1)
	if err := rdb.Do(ctx, "SET", keys[1], w.Value, "PX", w.TTLMillis, "NX").Err(); err != nil {
		t.Fatal(err)
	}
	writtenMs = rdb.Do(ctx, "PEXPIRETIME", keys[1]).Val().(int64) - w.TTLMillis
	d, _, err = algorithms.DecodeAcquireReply(check.Run(ctx, rdb, keys, algorithms.CheckArgs(l, 1, writtenMs+5)...).Val())
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("a second check of a fresh log of limit 2: %+v, %v", d, err)
	}
	entries = rdb.ZRangeWithScores(ctx, keys[0], 0, -1).Val()
	want := []redis.Z{{Score: float64(writtenMs), Member: "1:1"}, {Score: float64(writtenMs + 5), Member: "2:1"}}
	if fmt.Sprint(entries) != fmt.Sprint(want) {
		t.Fatalf("the log after a second check: %v, want %v", entries, want)
	}
	if v := rdb.Get(ctx, keys[1]).Val(); v != "2 2" {
		t.Fatalf("the meta key after a second check: %q, want \"2 2\"", v)
	}
}

// TestFreshLogBesideAnEvictedMetaKey: an evicting Redis may take a
// sliding log's meta key and leave its log; a node's fresh write then
// refills the meta key alone. The check and release scripts read such a
// meta key as missing and rebuild the state from the log, as they do for a
// missing one, rather than fail every check of the key until it expires;
// the fresh write's one entry, in no log, is what the eviction loosened.
func TestFreshLogBesideAnEvictedMetaKey(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	a := algorithms.SlidingWindowLog
	check := redis.NewScript(algorithms.CheckScript(a))
	release := redis.NewScript(algorithms.ReleaseScript(a))
	l := algorithms.Limit{Algorithm: a, Limit: 4, Period: time.Minute}
	keys := algorithms.Keys(a, "{evicted}")
	logKey, meta := keys[0], keys[1]
	now := redisNowMs(t, rdb)
	for i := range 2 {
		d, _, err := algorithms.DecodeAcquireReply(check.Run(ctx, rdb, keys, algorithms.CheckArgs(l, 1, now+int64(i))...).Val())
		if err != nil || !d.Allowed {
			t.Fatalf("check %d: %+v, %v", i, d, err)
		}
	}
	// The eviction, then a node's fresh write of one unit.
	rdb.Del(ctx, meta)
	w, _ := algorithms.Fresh(l, 1, 1)
	if err := rdb.Do(ctx, "SET", meta, w.Value, "PX", w.TTLMillis, "NX").Err(); err != nil {
		t.Fatal(err)
	}
	reply, err := release.Run(ctx, rdb, keys, algorithms.ReleaseArgs(l, 1, algorithms.Grant{Units: 1, Ref: 1}, now+10)...).Result()
	if n, derr := algorithms.DecodeReleaseReply(reply); err != nil || derr != nil || n != 1 {
		t.Fatalf("a release beside the fresh form: %d, %v, %v; want the unit of entry 1 given back", n, err, derr)
	}
	// The log holds entry 2 alone (1 unit): three more fit, the fourth does
	// not.
	for i, want := range []bool{true, true, true, false} {
		d, _, err := algorithms.DecodeAcquireReply(check.Run(ctx, rdb, keys, algorithms.CheckArgs(l, 1, now+20+int64(i))...).Val())
		if err != nil || d.Allowed != want {
			t.Fatalf("check %d after the eviction: %+v, %v; want allowed %v", i, d, err, want)
		}
	}
	if v := rdb.Get(ctx, meta).Val(); v != "4 5" {
		t.Fatalf("the meta key after the checks: %q, want \"4 5\" rebuilt from the log", v)
	}
	if n := rdb.ZCard(ctx, logKey).Val(); n != 4 {
		t.Fatalf("the log holds %d entries, want 4", n)
	}
}
