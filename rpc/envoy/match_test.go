package envoy

import (
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// matchPolicies are the policies the matching tests' rules name; each name
// says which rule should win, so a wrong match shows in the failure.
func matchPolicies() []node.Policy {
	var ps []node.Policy
	for _, name := range []string{"per-ip", "vip-ip", "per-ip-path", "vip-ip-login", "vip-ip-path", "per-path", "login", "api-users", "shadowed"} {
		ps = append(ps, node.Policy{Name: name, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Minute}})
	}
	return ps
}

// matchConfig exercises every matching rule: exact and default values,
// nesting below both, a rule with children and a limit of its own, a
// nesting-only rule, unlimited and shadow rules.
func matchConfig() Config {
	return Config{Domains: []Domain{
		{Domain: "edge", Descriptors: []Descriptor{
			{Key: "remote_address", Policy: "per-ip", Descriptors: []Descriptor{
				{Key: "path", Policy: "per-ip-path"},
			}},
			{Key: "remote_address", Value: "10.0.0.1", Policy: "vip-ip", Descriptors: []Descriptor{
				{Key: "path", Value: "/login", Policy: "vip-ip-login"},
				{Key: "path", Policy: "vip-ip-path"},
			}},
			{Key: "remote_address", Value: "10.0.0.2", Unlimited: true},
			{Key: "path", Value: "/login", Policy: "login"},
			{Key: "path", Policy: "per-path"},
			// Nesting only: "api" alone has no limit.
			{Key: "api", Value: "v1", Descriptors: []Descriptor{
				{Key: "user", Policy: "api-users"},
			}},
			{Key: "beta", Policy: "shadowed", ShadowMode: true},
		}},
		// Another domain's rules never apply to "edge".
		{Domain: "internal", Descriptors: []Descriptor{
			{Key: "tenant", Policy: "per-ip"},
		}},
	}}
}

func entries(kv ...string) []entry {
	es := make([]entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, entry{kv[i], kv[i+1]})
	}
	return es
}

// The descriptor matching rules, rule by rule. want is the policy of the
// rule that applies, "" for none, or "unlimited".
func TestMatch(t *testing.T) {
	table, err := compileTable(matchConfig(), lookupIn(matchPolicies()))
	if err != nil {
		t.Fatal(err)
	}
	edge := table.domains["edge"]
	for _, tc := range []struct {
		name    string
		entries []entry
		want    string
		shadow  bool
	}{
		{"default value matches any value", entries("remote_address", "192.0.2.7"), "per-ip", false},
		{"exact value beats the default", entries("remote_address", "10.0.0.1"), "vip-ip", false},
		{"exact value is case-sensitive", entries("remote_address", "10.0.0.1 "), "per-ip", false},
		{"unlimited exact value", entries("remote_address", "10.0.0.2"), "unlimited", false},
		{"nested default below a default", entries("remote_address", "192.0.2.7", "path", "/x"), "per-ip-path", false},
		{"nested exact below an exact", entries("remote_address", "10.0.0.1", "path", "/login"), "vip-ip-login", false},
		{"nested default below an exact", entries("remote_address", "10.0.0.1", "path", "/x"), "vip-ip-path", false},
		{"no backtracking: exact rule without children", entries("remote_address", "10.0.0.2", "path", "/x"), "", false},
		{"top-level exact path", entries("path", "/login"), "login", false},
		{"top-level default path", entries("path", "/home"), "per-path", false},
		{"unknown key", entries("user", "alice"), "", false},
		{"descriptor longer than the rules", entries("path", "/home", "user", "alice"), "", false},
		{"descriptor longer than nested rules", entries("remote_address", "192.0.2.7", "path", "/x", "user", "u"), "", false},
		{"nested key unknown at that level", entries("remote_address", "192.0.2.7", "user", "u"), "", false},
		{"descriptor shorter than the rules: nesting-only rule", entries("api", "v1"), "", false},
		{"nesting-only rule, then default", entries("api", "v1", "user", "alice"), "api-users", false},
		{"nesting-only rule needs its exact value", entries("api", "v2", "user", "alice"), "", false},
		{"order matters", entries("path", "/x", "remote_address", "192.0.2.7"), "", false},
		{"shadow rule", entries("beta", "on"), "shadowed", true},
		{"other domain's rules do not apply", entries("tenant", "t1"), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := edge.match(tc.entries)
			got := ""
			switch {
			case r == nil:
			case r.unlimited:
				got = "unlimited"
			default:
				got = r.policy.Name
			}
			if got != tc.want {
				t.Fatalf("match(%v) = %q, want %q", tc.entries, got, tc.want)
			}
			if r != nil && r.shadow != tc.shadow {
				t.Fatalf("match(%v).shadow = %t, want %t", tc.entries, r.shadow, tc.shadow)
			}
			if r != nil && !r.unlimited && r.policy.Limit.Limit != 10 {
				t.Fatalf("match(%v) has an unresolved policy %+v", tc.entries, r.policy)
			}
		})
	}
}

// Keys name the domain and every entry, and no crafted value can make two
// descriptors share one.
func TestCounterKey(t *testing.T) {
	for _, tc := range []struct {
		domain  string
		entries []entry
		want    string
	}{
		{"edge", entries("remote_address", "10.0.0.1"), "edge|remote_address=10.0.0.1"},
		{"edge", entries("remote_address", "10.0.0.1", "path", "/api"), "edge|remote_address=10.0.0.1|path=/api"},
		{"edge", entries("remote_address", "10.0.0.1|path=/api"), "edge|remote_address=10.0.0.1%7Cpath%3D/api"},
		{"ed|ge", entries("a=b", "100%"), "ed%7Cge|a%3Db=100%25"},
		{"edge", entries("k", "2001:db8::1 ü"), "edge|k=2001:db8::1 ü"},
	} {
		if got := counterKey(tc.domain, tc.entries); got != tc.want {
			t.Errorf("counterKey(%q, %v) = %q, want %q", tc.domain, tc.entries, got, tc.want)
		}
	}
	// Pairs that naive joining would confuse.
	for _, pair := range [][2]string{
		{counterKey("edge", entries("a", "1|b=2")), counterKey("edge", entries("a", "1", "b", "2"))},
		{counterKey("edge|a=1", entries("b", "2")), counterKey("edge", entries("a", "1", "b", "2"))},
		{counterKey("edge", entries("a=1", "2")), counterKey("edge", entries("a", "1=2"))},
		{counterKey("edge", entries("a", "%7C")), counterKey("edge", entries("a", "|"))},
	} {
		if pair[0] == pair[1] {
			t.Errorf("two descriptors share the key %q", pair[0])
		}
	}
}

// Envoy's unit and multiplier for each policy period: the longest unit that
// divides the period, UNKNOWN when none does.
func TestUnitToProto(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		period time.Duration
		unit   string
		mult   uint32 // 0: unset
	}{
		{time.Second, "SECOND", 0},
		{30 * time.Second, "SECOND", 30},
		{90 * time.Second, "SECOND", 90},
		{time.Minute, "MINUTE", 0},
		{5 * time.Minute, "MINUTE", 5},
		{time.Hour, "HOUR", 0},
		{36 * time.Hour, "HOUR", 36},
		{day, "DAY", 0},
		{7 * day, "DAY", 7},
		{30 * day, "MONTH", 0},
		{60 * day, "MONTH", 2},
		{365 * day, "YEAR", 0},
		{500 * time.Millisecond, "UNKNOWN", 0},
		{1500 * time.Millisecond, "UNKNOWN", 0},
	} {
		unit, mult := unitToProto(tc.period)
		if unit.String() != tc.unit || mult.GetValue() != tc.mult || (tc.mult == 0) != (mult == nil) {
			t.Errorf("unitToProto(%s) = %s × %v, want %s × %d", tc.period, unit, mult, tc.unit, tc.mult)
		}
	}
}

// A '*' anywhere in a file's value stands for any run of characters, none
// included, as in envoyproxy/ratelimit's README (bar*b, foo*bar*baz): the
// first such rule in the file's order that matches wins, after the exact
// values and before the key's default.
func TestWildcardsAnywhereInTheValue(t *testing.T) {
	named := func(n string) *RateLimit { return &RateLimit{Unit: "minute", RequestsPerUnit: rpu(1), Name: n} }
	c := Config{DropIn: true, Domains: []Domain{{Domain: "w", File: "w.yaml", Descriptors: []Descriptor{
		{Key: "midWild", Value: "bar*b", RateLimit: named("1")},
		{Key: "multiWild", Value: "foo*bar*baz", RateLimit: named("2")},
		{Key: "multiWild", Value: "foo*", RateLimit: named("3")},
		{Key: "multiWild", Value: "foobarbaz", RateLimit: named("4")},
		{Key: "lead", Value: "*.png", RateLimit: named("5")},
		{Key: "lead", RateLimit: named("6")},
	}}}}
	rules, err := Compile(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	lvl := rules.table.domains["w"]
	for _, tc := range []struct {
		key, value string
		want       string // the winning limit's name; "" for none
	}{
		{"midWild", "barab", "1"}, {"midWild", "barb", "1"}, {"midWild", "bar", ""}, {"midWild", "barba", ""}, {"midWild", "xbarb", ""},
		{"multiWild", "foobarbaz", "4"}, {"multiWild", "foo-bar-baz", "2"}, {"multiWild", "foobazbar", "3"}, {"multiWild", "fobarbaz", ""},
		{"lead", "a.png", "5"}, {"lead", ".png", "5"}, {"lead", "a.png.jpg", "6"},
	} {
		got := ""
		if r := lvl.match([]entry{{tc.key, tc.value}}); r != nil {
			got = r.name
		}
		if got != tc.want {
			t.Errorf("%s=%s: rule %q, want %q", tc.key, tc.value, got, tc.want)
		}
	}
}
