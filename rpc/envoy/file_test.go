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

// Rules of envoyproxy/ratelimit's schema (EnvoyDomain.File set): what its
// config files say, as cmd/quotad hands them over.

func rpu(n uint32) *uint32 { return &n }

// perUnit is a rate_limit block of n requests per unit.
func perUnit(n uint32, unit string) *EnvoyRateLimit {
	return &EnvoyRateLimit{Unit: unit, RequestsPerUnit: rpu(n)}
}

func fileDomain(file, domain string, ds ...EnvoyDescriptor) EnvoyDomain {
	return EnvoyDomain{Domain: domain, File: file, Descriptors: ds}
}

// Every mistake in a file is refused, naming the file, the line and the
// descriptor path.
func TestEnvoyFileRulesValidate(t *testing.T) {
	policies := append(rlsPolicies(), node.Policy{Name: "huge", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: math.MaxUint32 + 1, Period: time.Minute}})
	nested := func(d EnvoyDescriptor) EnvoyConfig {
		return EnvoyConfig{Domains: []EnvoyDomain{fileDomain("a.yaml", "edge",
			EnvoyDescriptor{Key: "ok", RateLimit: perUnit(1, "second")},
			EnvoyDescriptor{Key: "parent", Line: 5, Descriptors: []EnvoyDescriptor{d}})}}
	}
	for _, tc := range []struct {
		name          string
		cfg           EnvoyConfig
		want          string
		unknownPolicy bool
	}{
		{"empty domain", EnvoyConfig{Domains: []EnvoyDomain{fileDomain("a.yaml", "")}}, "a.yaml: domain: invalid rpc config: must not be empty", false},
		{"domain in two files", EnvoyConfig{Domains: []EnvoyDomain{fileDomain("a.yaml", "edge"), fileDomain("b.yaml", "edge")}},
			`b.yaml: domain: invalid rpc config: "edge" is configured twice (also in a.yaml)`, false},
		{"domain in the config file and a file", EnvoyConfig{Domains: []EnvoyDomain{
			{Domain: "edge", Descriptors: []EnvoyDescriptor{{Key: "k", Policy: "per-ip"}}}, fileDomain("b.yaml", "edge"),
		}}, `b.yaml: domain: invalid rpc config: "edge" is configured twice (also in envoy.domains[0] of the config file)`, false},
		{"empty key", nested(EnvoyDescriptor{Line: 7, RateLimit: perUnit(1, "second")}),
			"a.yaml: line 7: descriptors[1].descriptors[0].key: invalid rpc config: must not be empty", false},
		{"bad unit", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: perUnit(1, "fortnight")}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.unit: invalid rpc config: "fortnight" is not a unit: write second, minute, hour, day, week, month or year`, false},
		{"missing unit", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: &EnvoyRateLimit{RequestsPerUnit: rpu(3)}}),
			`rate_limit.unit: invalid rpc config: "" is not a unit`, false},
		{"unlimited with a unit", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: &EnvoyRateLimit{Unlimited: true, Unit: "second"}}),
			"a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.unit: invalid rpc config: an unlimited rate limit takes no unit", false},
		{"empty replaces", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: &EnvoyRateLimit{Unit: "second", RequestsPerUnit: rpu(1), Replaces: []string{"x", ""}}}),
			"line 7: descriptors[1].descriptors[0].rate_limit.replaces[1].name: invalid rpc config: a replaced limit needs a name", false},
		{"replaces itself", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: &EnvoyRateLimit{Unit: "second", RequestsPerUnit: rpu(1), Name: "n", Replaces: []string{"n"}}}),
			`rate_limit.replaces[0].name: invalid rpc config: limit "n" cannot replace itself`, false},
		{"quotad_policy with a unit", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: &EnvoyRateLimit{Policy: "login", Unit: "second"}}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit: invalid rpc config: quotad_policy "login" says how to limit; it excludes unit, requests_per_unit and unlimited`, false},
		{"quotad_policy with requests_per_unit 0", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: &EnvoyRateLimit{Policy: "login", RequestsPerUnit: rpu(0)}}),
			`it excludes unit, requests_per_unit and unlimited`, false},
		{"unknown quotad_policy", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: &EnvoyRateLimit{Policy: "nope"}}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.quotad_policy: invalid rpc config: unknown policy "nope"`, true},
		{"quotad_policy too large for Envoy", nested(EnvoyDescriptor{Key: "k", Line: 7, RateLimit: &EnvoyRateLimit{Policy: "huge"}}),
			`rate_limit.quotad_policy: invalid rpc config: policy "huge": limit 4294967296 (burst 0) exceeds 4294967295`, false},
		{"duplicate value", nested(EnvoyDescriptor{Key: "k", Value: "v", Line: 7, Descriptors: []EnvoyDescriptor{
			{Key: "x", Value: "1", Line: 8}, {Key: "x", Value: "1", Line: 9},
		}}), "a.yaml: line 9: descriptors[1].descriptors[0].descriptors[1]: invalid rpc config: a rule for x=1 comes twice at this level", false},
		{"duplicate wildcard", nested(EnvoyDescriptor{Key: "k", Value: "v", Line: 7, Descriptors: []EnvoyDescriptor{
			{Key: "x", Value: "a*", Line: 8}, {Key: "x", Value: "b*", Line: 9}, {Key: "x", Value: "a*", Line: 10},
		}}), "line 10: descriptors[1].descriptors[0].descriptors[2]: invalid rpc config: a rule for x=a* comes twice at this level", false},
		{"duplicate default", nested(EnvoyDescriptor{Key: "k", Value: "v", Line: 7, Descriptors: []EnvoyDescriptor{
			{Key: "x", Line: 8}, {Key: "x", Line: 9},
		}}), `line 9: descriptors[1].descriptors[0].descriptors[1]: invalid rpc config: a rule for key "x" with no value comes twice`, false},
		{"quotad's fields in a file", nested(EnvoyDescriptor{Key: "k", Line: 7, Policy: "login"}),
			"a.yaml: line 7: descriptors[1].descriptors[0]: invalid rpc config: policy and unlimited belong to quotad's config file", false},
		{"a file's fields in quotad's schema", one("edge", EnvoyDescriptor{Key: "k", RateLimit: perUnit(1, "second")}),
			"envoy.domains[0].descriptors[0].rate_limit: invalid rpc config: rate_limit belongs to envoyproxy/ratelimit's files", false},
		{"near limit ratio", EnvoyConfig{NearLimitRatio: 1.5}, "envoy near limit ratio: invalid rpc config: 1.5 is not in (0, 1]", false},
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
	ok := EnvoyConfig{Domains: []EnvoyDomain{
		fileDomain("empty.yaml", "empty"),
		fileDomain("a.yaml", "edge",
			EnvoyDescriptor{Key: "whitelisted", Value: "x", ShadowMode: true, DetailedMetric: true},
			EnvoyDescriptor{Key: "blocked", RateLimit: &EnvoyRateLimit{Unit: "Second"}},
			EnvoyDescriptor{Key: "weekly", RateLimit: perUnit(7, "WEEK")},
			EnvoyDescriptor{Key: "yearly", RateLimit: perUnit(7, "year")},
			EnvoyDescriptor{Key: "r", RateLimit: &EnvoyRateLimit{Unit: "day", RequestsPerUnit: rpu(1), Replaces: []string{"nobody"}}},
			EnvoyDescriptor{Key: "free", RateLimit: &EnvoyRateLimit{Unlimited: true, Name: "free", RequestsPerUnit: rpu(5)}},
			EnvoyDescriptor{Key: "bucket", RateLimit: &EnvoyRateLimit{Policy: "login", Name: "named"}},
		),
	}}
	if err := ok.Validate(policies); err != nil {
		t.Fatalf("valid files refused: %v", err)
	}
}

// Value wildcards: exact values first, then the first wildcard written
// whose prefix matches, then the key's default; only a trailing '*' is a
// wildcard; a rule without rate_limit applies and limits nothing.
func TestRLSFileMatch(t *testing.T) {
	named := func(n string) *EnvoyRateLimit {
		return &EnvoyRateLimit{Unit: "minute", RequestsPerUnit: rpu(1), Name: n}
	}
	table, err := compileRLS(EnvoyConfig{Domains: []EnvoyDomain{fileDomain("a.yaml", "edge",
		EnvoyDescriptor{Key: "path", Value: "/api/v1", RateLimit: named("exact")},
		EnvoyDescriptor{Key: "path", Value: "/api/v1*", RateLimit: named("v1-prefix")},
		EnvoyDescriptor{Key: "path", Value: "/api/*", RateLimit: named("api-prefix")},
		EnvoyDescriptor{Key: "path", Value: "/api/v1/x*", RateLimit: named("shadowed-by-earlier")},
		EnvoyDescriptor{Key: "path", RateLimit: named("default")},
		EnvoyDescriptor{Key: "user", Value: "*", RateLimit: named("any-user"), Descriptors: []EnvoyDescriptor{
			{Key: "tier", Value: "gold*", RateLimit: named("gold")},
		}},
		EnvoyDescriptor{Key: "literal", Value: "a*b", RateLimit: named("literal")},
		EnvoyDescriptor{Key: "free", Value: "yes"},
	)}}, lookupIn(nil))
	if err != nil {
		t.Fatal(err)
	}
	edge := table.domains["edge"]
	for _, tc := range []struct {
		entries []rlsEntry
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
