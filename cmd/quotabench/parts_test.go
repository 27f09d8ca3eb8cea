package main

import (
	"math"
	"testing"
	"time"
)

func TestParseCommandStats(t *testing.T) {
	text := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=1000,usec=5203,usec_per_call=5.20,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_client|setinfo:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=7,usec=300,usec_per_call=42.86,rejected_calls=0,failed_calls=0\r\n"
	s, err := parseCommandStats(text)
	if err != nil {
		t.Fatal(err)
	}
	want := commandStats{"evalsha": 1000, "client|setinfo": 2, "info": 7}
	if len(s) != len(want) {
		t.Fatalf("got %v, want %v", s, want)
	}
	for k, v := range want {
		if s[k] != v {
			t.Fatalf("got %v, want %v", s, want)
		}
	}
	if _, err := parseCommandStats("cmdstat_get:calls=x,usec=1\r\n"); err == nil {
		t.Fatal("bad calls accepted")
	}
}

func TestDiffStats(t *testing.T) {
	before := commandStats{"evalsha": 10, "info": 3, "time": 10}
	after := commandStats{"evalsha": 110, "eval": 2, "info": 5, "time": 112, "hello": 4}
	// One of the two new INFO calls was ours; the other someone else's.
	r := diffStats(before, after, 1, 100, 50)
	if r.Scripts != 102 || r.Commands != 102+102+4+1 {
		t.Fatalf("scripts %d commands %d (%v)", r.Scripts, r.Commands, r.ByCommand)
	}
	if r.ByCommand["info"] != 1 {
		t.Fatalf("info %d, want the other client's 1", r.ByCommand["info"])
	}
	if r.ScriptsPerCheck != 1.02 || r.ScriptsPerAllowedCheck != 2.04 {
		t.Fatalf("per check %v, per allowed %v", r.ScriptsPerCheck, r.ScriptsPerAllowedCheck)
	}
	if math.Abs(r.ScriptShare-102.0/209) > 1e-12 {
		t.Fatalf("share %v", r.ScriptShare)
	}
	if got := r.sortedCommands(); got[0] != "evalsha" && got[0] != "time" {
		t.Fatalf("sorted %v", got)
	}
}

func TestKeyGen(t *testing.T) {
	cfg := config{Keys: keysZipf, NKeys: 1000, ZipfS: 1.5, Seed: 7, KeyPrefix: "p-"}
	a, b, c := newKeyGen(cfg, 0), newKeyGen(cfg, 0), newKeyGen(cfg, 1)
	counts := map[string]int{}
	differ := false
	for range 10000 {
		ka, kb, kc := a.key(), b.key(), c.key()
		if ka != kb {
			t.Fatalf("same seed and client gave %q and %q", ka, kb)
		}
		differ = differ || ka != kc
		counts[ka]++
	}
	if !differ {
		t.Fatal("clients 0 and 1 drew the same keys")
	}
	// Rank 0 is the hottest Zipf key: with s = 1.5 it takes over a third.
	if counts["p-0"] < 3000 || counts["p-0"] < counts["p-1"] {
		t.Fatalf("p-0 drawn %d times, p-1 %d, of 10000", counts["p-0"], counts["p-1"])
	}
	for k := range counts {
		if len(k) < 3 || k[:2] != "p-" {
			t.Fatalf("key %q", k)
		}
	}

	u := newKeyGen(config{Keys: keysUniform, NKeys: 10, KeyPrefix: "u"}, 3)
	seen := map[string]bool{}
	for range 1000 {
		seen[u.key()] = true
	}
	if len(seen) != 10 {
		t.Fatalf("uniform over 10 keys drew %d distinct", len(seen))
	}
	s := newKeyGen(config{Keys: keysSingle, NKeys: 1, KeyPrefix: "s"}, 3)
	if first, second := s.key(), s.key(); first != "s0" || second != "s0" {
		t.Fatal("single is not s0")
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h1, h2 histogram
	for i := 1; i <= 500; i++ {
		h1.record(time.Duration(i) * time.Microsecond)
		h2.record(time.Duration(500+i) * time.Microsecond)
	}
	var m merged
	m.add(&h1)
	m.add(&h2)
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.9, 900 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, time.Millisecond}} {
		got := m.quantile(c.q)
		if diff := math.Abs(float64(got-c.want)) / float64(c.want); diff > 0.005 {
			t.Errorf("q%v = %s, want %s ± 0.5%%", c.q, got, c.want)
		}
	}
	if m.max != time.Millisecond || m.n != 1000 {
		t.Fatalf("max %s n %d", m.max, m.n)
	}
}
