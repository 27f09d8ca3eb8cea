package envoy

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// Rules of envoyproxy/ratelimit's schema (Domain.File set): what its
// config files say, as cmd/quotad hands them over.

func rpu(n uint32) *uint32 { return &n }

// perUnit is a rate_limit block of n requests per unit.
func perUnit(n uint32, unit string) *RateLimit {
	return &RateLimit{Unit: unit, RequestsPerUnit: rpu(n)}
}

func fileDomain(file, domain string, ds ...Descriptor) Domain {
	return Domain{Domain: domain, File: file, Descriptors: ds}
}

// Every mistake in a file is refused, naming the file, the line and the
// descriptor path.
func TestFileRulesValidate(t *testing.T) {
	policies := append(matchPolicies(), node.Policy{Name: "huge", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: math.MaxUint32 + 1, Period: time.Minute}})
	nested := func(d Descriptor) Config {
		return Config{Domains: []Domain{fileDomain("a.yaml", "edge",
			Descriptor{Key: "ok", RateLimit: perUnit(1, "second")},
			Descriptor{Key: "parent", Line: 5, Descriptors: []Descriptor{d}})}}
	}
	for _, tc := range []struct {
		name          string
		cfg           Config
		want          string
		unknownPolicy bool
	}{
		{"empty domain", Config{Domains: []Domain{fileDomain("a.yaml", "")}}, "a.yaml: domain: invalid rpc config: must not be empty", false},
		{"domain in two files", Config{Domains: []Domain{fileDomain("a.yaml", "edge"), fileDomain("b.yaml", "edge")}},
			`b.yaml: domain: invalid rpc config: "edge" is configured twice (also in a.yaml)`, false},
		{"domain in the config file and a file", Config{Domains: []Domain{
			{Domain: "edge", Descriptors: []Descriptor{{Key: "k", Policy: "per-ip"}}}, fileDomain("b.yaml", "edge"),
		}}, `b.yaml: domain: invalid rpc config: "edge" is configured twice (also in envoy.domains[0] of the config file)`, false},
		{"empty key", nested(Descriptor{Line: 7, RateLimit: perUnit(1, "second")}),
			"a.yaml: line 7: descriptors[1].descriptors[0].key: invalid rpc config: must not be empty", false},
		{"bad unit", nested(Descriptor{Key: "k", Line: 7, RateLimit: perUnit(1, "fortnight")}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.unit: invalid rpc config: "fortnight" is not a unit: write second, minute, hour, day, week, month or year`, false},
		{"missing unit", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{RequestsPerUnit: rpu(3)}}),
			`rate_limit.unit: invalid rpc config: "" is not a unit`, false},
		{"unlimited with a unit", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Unlimited: true, Unit: "second"}}),
			"a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.unit: invalid rpc config: an unlimited rate limit takes no unit", false},
		{"empty replaces", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: rpu(1), Replaces: []string{"x", ""}}}),
			"line 7: descriptors[1].descriptors[0].rate_limit.replaces[1].name: invalid rpc config: a replaced limit needs a name", false},
		{"replaces itself", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: rpu(1), Name: "n", Replaces: []string{"n"}}}),
			`rate_limit.replaces[0].name: invalid rpc config: limit "n" cannot replace itself`, false},
		{"quotad_policy with a unit", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Policy: "login", Unit: "second"}}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit: invalid rpc config: quotad_policy "login" says how to limit; it excludes unit, requests_per_unit and unlimited`, false},
		{"quotad_policy with requests_per_unit 0", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Policy: "login", RequestsPerUnit: rpu(0)}}),
			`it excludes unit, requests_per_unit and unlimited`, false},
		{"unknown quotad_policy", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Policy: "nope"}}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.quotad_policy: invalid rpc config: unknown policy "nope"`, true},
		{"quotad_policy too large for Envoy", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Policy: "huge"}}),
			`rate_limit.quotad_policy: invalid rpc config: policy "huge": limit 4294967296 (burst 0) exceeds 4294967295`, false},
		{"duplicate value", nested(Descriptor{Key: "k", Value: "v", Line: 7, Descriptors: []Descriptor{
			{Key: "x", Value: "1", Line: 8}, {Key: "x", Value: "1", Line: 9},
		}}), "a.yaml: line 9: descriptors[1].descriptors[0].descriptors[1]: invalid rpc config: a rule for x=1 comes twice at this level", false},
		{"duplicate wildcard", nested(Descriptor{Key: "k", Value: "v", Line: 7, Descriptors: []Descriptor{
			{Key: "x", Value: "a*", Line: 8}, {Key: "x", Value: "b*", Line: 9}, {Key: "x", Value: "a*", Line: 10},
		}}), "line 10: descriptors[1].descriptors[0].descriptors[2]: invalid rpc config: a rule for x=a* comes twice at this level", false},
		{"duplicate default", nested(Descriptor{Key: "k", Value: "v", Line: 7, Descriptors: []Descriptor{
			{Key: "x", Line: 8}, {Key: "x", Line: 9},
		}}), `line 9: descriptors[1].descriptors[0].descriptors[1]: invalid rpc config: a rule for key "x" with no value comes twice`, false},
		{"quotad's fields in a file", nested(Descriptor{Key: "k", Line: 7, Policy: "login"}),
			"a.yaml: line 7: descriptors[1].descriptors[0]: invalid rpc config: policy and unlimited belong to quotad's config file", false},
		{"a file's fields in quotad's schema", one("edge", Descriptor{Key: "k", RateLimit: perUnit(1, "second")}),
			"envoy.domains[0].descriptors[0].rate_limit: invalid rpc config: rate_limit belongs to envoyproxy/ratelimit's files", false},
		{"near limit ratio", Config{NearLimitRatio: 1.5}, "envoy near limit ratio: invalid rpc config: 1.5 is not in (0, 1]", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate(policies)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error containing %q", err, tc.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Validate: %v does not wrap ErrInvalidConfig", err)
			}
			if got := errors.Is(err, node.ErrUnknownPolicy); got != tc.unknownPolicy {
				t.Errorf("Validate: errors.Is(%v, node.ErrUnknownPolicy) = %t, want %t", err, got, tc.unknownPolicy)
			}
		})
	}

	// What envoyproxy/ratelimit accepts, quotad accepts: an empty domain
	// (no descriptors), a rule that limits nothing, shadow_mode and
	// detailed_metric anywhere, requests_per_unit left out, units in any
	// case, replaces naming limits that do not exist.
	ok := Config{Domains: []Domain{
		fileDomain("empty.yaml", "empty"),
		fileDomain("a.yaml", "edge",
			Descriptor{Key: "whitelisted", Value: "x", ShadowMode: true, DetailedMetric: true},
			Descriptor{Key: "blocked", RateLimit: &RateLimit{Unit: "Second"}},
			Descriptor{Key: "weekly", RateLimit: perUnit(7, "WEEK")},
			Descriptor{Key: "yearly", RateLimit: perUnit(7, "year")},
			Descriptor{Key: "r", RateLimit: &RateLimit{Unit: "day", RequestsPerUnit: rpu(1), Replaces: []string{"nobody"}}},
			Descriptor{Key: "free", RateLimit: &RateLimit{Unlimited: true, Name: "free", RequestsPerUnit: rpu(5)}},
			Descriptor{Key: "bucket", RateLimit: &RateLimit{Policy: "login", Name: "named"}},
		),
	}}
	if err := ok.Validate(policies); err != nil {
		t.Fatalf("valid files refused: %v", err)
	}
}

// Value wildcards: exact values first, then the first wildcard written
// whose prefix matches, then the key's default; only a trailing '*' is a
// wildcard; a rule without rate_limit applies and limits nothing.
func TestFileMatch(t *testing.T) {
	named := func(n string) *RateLimit {
		return &RateLimit{Unit: "minute", RequestsPerUnit: rpu(1), Name: n}
	}
	table, err := compileTable(Config{Domains: []Domain{fileDomain("a.yaml", "edge",
		Descriptor{Key: "path", Value: "/api/v1", RateLimit: named("exact")},
		Descriptor{Key: "path", Value: "/api/v1*", RateLimit: named("v1-prefix")},
		Descriptor{Key: "path", Value: "/api/*", RateLimit: named("api-prefix")},
		Descriptor{Key: "path", Value: "/api/v1/x*", RateLimit: named("shadowed-by-earlier")},
		Descriptor{Key: "path", RateLimit: named("default")},
		Descriptor{Key: "user", Value: "*", RateLimit: named("any-user"), Descriptors: []Descriptor{
			{Key: "tier", Value: "gold*", RateLimit: named("gold")},
		}},
		Descriptor{Key: "literal", Value: "a*b", RateLimit: named("literal")},
		Descriptor{Key: "free", Value: "yes"},
	)}}, lookupIn(nil))
	if err != nil {
		t.Fatal(err)
	}
	edge := table.domains["edge"]
	for _, tc := range []struct {
		entries []entry
		want    string // the rule's name; "" none; "(whitelisted)" a rule without a limit
	}{
		{entries("path", "/api/v1"), "exact"},
		{entries("path", "/api/v1/x/y"), "v1-prefix"},
		{entries("path", "/api/v2"), "api-prefix"},
		{entries("path", "/api/"), "api-prefix"},
		{entries("path", "/home"), "default"},
		{entries("user", "alice"), "any-user"},
		{entries("user", "alice", "tier", "gold-plus"), "gold"},
		{entries("user", "alice", "tier", "silver"), ""},
		{entries("literal", "a*b"), "literal"},
		{entries("literal", "axb"), ""},
		{entries("free", "yes"), "(whitelisted)"},
		{entries("free", "no"), ""},
	} {
		r := edge.match(tc.entries)
		got := ""
		if r != nil {
			got = r.name
		}
		if tc.want == "(whitelisted)" {
			// A rule that limits nothing is found, and has no limit.
			if n := edge.find(tc.entries[0]); n == nil || n.rule != nil {
				t.Errorf("%v: node %+v, want a rule without a limit", tc.entries, n)
			}
			tc.want = ""
		}
		if got != tc.want {
			t.Errorf("match(%v) = %q, want %q", tc.entries, got, tc.want)
		}
	}
}
