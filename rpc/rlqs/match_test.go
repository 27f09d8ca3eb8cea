package rlqs

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

func testPolicy(t *testing.T, name string, a algorithms.Algorithm) node.Policy {
	t.Helper()
	p, err := node.NewPolicy(node.Policy{Name: name, Limit: algorithms.Limit{Algorithm: a, Limit: 10, Period: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTheFirstMatchingRuleApplies(t *testing.T) {
	p := testPolicy(t, "per-client", algorithms.TokenBucket)
	cfg := Config{Domains: []Domain{{
		Name: "edge",
		Buckets: []Rule{
			{Bucket: map[string]string{"tier": "internal"}, Target: Target{Action: ActionAllowAll}},
			{Bucket: map[string]string{"name": "api-*-v*"}, Target: Target{Policy: p.Name}},
			{Bucket: map[string]string{}, Target: Target{Action: ActionDenyAll}},
		},
	}, {Name: "other", Default: Target{Policy: p.Name}}}}
	if err := cfg.Validate([]node.Policy{p}); err != nil {
		t.Fatal(err)
	}
	rs := compile(cfg, []node.Policy{p})
	for _, tc := range []struct {
		domain string
		id     map[string]string
		want   string
	}{
		{"edge", map[string]string{"tier": "internal", "name": "api-a-v1"}, ActionAllowAll},
		{"edge", map[string]string{"name": "api-orders-v2", "x": "y"}, "per-client"},
		{"edge", map[string]string{"name": "api-orders"}, ActionDenyAll},
		{"other", map[string]string{"name": "x"}, "per-client"},
	} {
		got, ok := rs.match(tc.domain, tc.id)
		if !ok || got.rule != tc.want {
			t.Errorf("%s %v: %q (%v), want %q", tc.domain, tc.id, got.rule, ok, tc.want)
		}
	}
	if _, ok := rs.match("nope", map[string]string{"a": "b"}); ok {
		t.Error("an unknown domain matched")
	}
}

func TestValueMatchesPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"*", "", true}, {"*", "anything", true}, {"a", "a", true}, {"a", "b", false},
		{"files/*", "files/x.pdf", true}, {"files/*", "file", false},
		{"bar*b", "barb", true}, {"bar*b", "bar", false},
		{"foo*bar*baz", "foo1bar2baz", true}, {"foo*bar*baz", "foobazbar", false},
	} {
		if got := valueMatches(tc.pattern, tc.value); got != tc.want {
			t.Errorf("valueMatches(%q, %q) = %v, want %v", tc.pattern, tc.value, got, tc.want)
		}
	}
}

func TestCounterKeyOrdersAndEscapes(t *testing.T) {
	got := counterKey("edge", map[string]string{"b": "x|y", "a": "1=2"})
	if want := "edge|a=1%3D2|b=x%7Cy"; got != want {
		t.Fatalf("counterKey = %q, want %q", got, want)
	}
}

// Config.Validate refuses what cannot work, saying which field and what
// to write.
func TestValidateRefusesWhatCannotWork(t *testing.T) {
	tb := testPolicy(t, "tb", algorithms.TokenBucket)
	fw := testPolicy(t, "fw", algorithms.FixedWindow)
	policies := []node.Policy{tb, fw}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Domains: []Domain{{Name: "e", Buckets: []Rule{{Target: Target{Policy: "fw"}}}}}}, `domains[0].buckets[0].policy: invalid rlqs config: "fw" uses fixed_window`},
		{Config{Domains: []Domain{{Name: "e", Buckets: []Rule{{Target: Target{Policy: "nope"}}}}}}, `"nope" is not a configured policy`},
		{Config{Domains: []Domain{{Name: "e", Buckets: []Rule{{Target: Target{Policy: "tb", Action: ActionDenyAll}}}}}}, "write one of them"},
		{Config{Domains: []Domain{{Name: "e", Buckets: []Rule{{}}}}}, "neither policy nor action"},
		{Config{Domains: []Domain{{Name: "e", Default: Target{Action: "allow"}}}}, `domains[0].default.action: invalid rlqs config: "allow" is not an action`},
		{Config{Domains: []Domain{{Name: "e"}, {Name: "e"}}}, `domains[1].domain: invalid rlqs config: "e" is also domains[0]`},
		{Config{Domains: []Domain{{}}}, "domains[0].domain: invalid rlqs config: missing"},
		{Config{AssignmentInterval: 1500 * time.Millisecond}, "assignment_interval: invalid rlqs config: 1.5s"},
		{Config{AssignmentInterval: 10 * time.Second, AbandonAfter: 5 * time.Second}, "abandon_after: invalid rlqs config: 5s is shorter"},
	} {
		err := tc.cfg.Validate(policies)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error with %q", tc.cfg, err, tc.want)
		}
	}
	if err := (Config{Domains: []Domain{{Name: "e", Default: Target{Policy: "tb"}}}}).Validate(policies); err != nil {
		t.Errorf("a valid config: %v", err)
	}
}

// However the shares move, the token buckets a member keeps or replaces
// add up to at most the shares, and a share that moved less than the
// hysteresis keeps its token bucket when the others leave room.
func TestKeepOrReplaceStaysWithinTheShares(t *testing.T) {
	s := &Service{}
	a := &bucket{assigned: bucketFor(8)}
	b := &bucket{assigned: bucketFor(28)}
	c := &bucket{assigned: bucketFor(8)}
	for _, shares := range []map[*bucket]float64{
		{a: 8.3, b: 27.4, c: 8.3}, // a, c up a little, b down: all kept fits
		{a: 7.6, b: 28.8, c: 7.6}, // a, c down a little, b up
		{a: 7.5, b: 25, c: 11.5},  // b down by more than 10 %
		{a: 7.9, b: 27.9, c: 7.9}, // all down a little: not all can stay
	} {
		out := s.keepOrReplace(shares)
		var total, sum float64
		for bk, want := range shares {
			total += want
			sum += out[bk].rate()
		}
		if sum > total+1e-9 {
			t.Errorf("shares %v: token buckets of %v a second in all, above the shares' %v", shares, sum, total)
		}
	}
	out := s.keepOrReplace(map[*bucket]float64{a: 8.3, b: 27.4, c: 8.3})
	if out[a] != a.assigned || out[b] != b.assigned || out[c] != c.assigned {
		t.Errorf("shares within 10 %% and room for all: %+v, want every token bucket kept", out)
	}
}
