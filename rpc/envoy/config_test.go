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

// Every configuration mistake is refused, naming the field as the config
// file spells it.
func TestConfigValidate(t *testing.T) {
	huge := node.Policy{Name: "huge", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: math.MaxUint32 + 1, Period: time.Minute}}
	hugeBurst := node.Policy{Name: "huge-burst", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Burst: math.MaxUint32 + 1, Period: time.Minute}}
	policies := append(matchPolicies(), huge, hugeBurst)
	for _, tc := range []struct {
		name          string
		cfg           Config
		want          string // in the message
		unknownPolicy bool
	}{
		{"empty domain", Config{Domains: []Domain{{Descriptors: []Descriptor{{Key: "k", Policy: "per-ip"}}}}},
			"envoy.domains[0].domain: invalid envoy config: must not be empty", false},
		{"duplicate domain", Config{Domains: []Domain{
			{Domain: "edge", Descriptors: []Descriptor{{Key: "k", Policy: "per-ip"}}},
			{Domain: "edge", Descriptors: []Descriptor{{Key: "k", Policy: "per-ip"}}},
		}}, `envoy.domains[1].domain: invalid envoy config: "edge" is configured twice`, false},
		{"domain without rules", Config{Domains: []Domain{{Domain: "edge"}}},
			`envoy.domains[0].descriptors: invalid envoy config: domain "edge" has none`, false},
		{"empty key", one("edge", Descriptor{Policy: "per-ip"}),
			"envoy.domains[0].descriptors[0].key: invalid envoy config: must not be empty", false},
		{"duplicate value", Config{Domains: []Domain{{Domain: "edge", Descriptors: []Descriptor{
			{Key: "k", Value: "v", Policy: "per-ip"}, {Key: "k", Value: "w", Policy: "per-ip"}, {Key: "k", Value: "v", Policy: "login"},
		}}}}, "envoy.domains[0].descriptors[2]: invalid envoy config: a rule for k=v comes twice at this level", false},
		{"duplicate default", Config{Domains: []Domain{{Domain: "edge", Descriptors: []Descriptor{
			{Key: "k", Policy: "per-ip"}, {Key: "k", Policy: "login"},
		}}}}, `envoy.domains[0].descriptors[1]: invalid envoy config: a rule for key "k" with no value comes twice at this level`, false},
		{"policy and unlimited", one("edge", Descriptor{Key: "k", Policy: "per-ip", Unlimited: true}),
			`envoy.domains[0].descriptors[0]: invalid envoy config: policy "per-ip" and unlimited exclude each other`, false},
		{"shadow without policy", one("edge", Descriptor{Key: "k", ShadowMode: true, Unlimited: true}),
			"envoy.domains[0].descriptors[0].shadow_mode: invalid envoy config: needs a policy", false},
		{"rule that applies to nothing", one("edge", Descriptor{Key: "k", Value: "v"}),
			"envoy.domains[0].descriptors[0]: invalid envoy config: rule k applies to nothing", false},
		{"unknown policy", one("edge", Descriptor{Key: "k", Policy: "per-ipp"}),
			`envoy.domains[0].descriptors[0].policy: invalid envoy config: unknown policy "per-ipp"`, true},
		{"unknown policy, nested", Config{Domains: []Domain{
			{Domain: "edge", Descriptors: []Descriptor{{Key: "k", Policy: "per-ip"}}},
			{Domain: "api", Descriptors: []Descriptor{{Key: "a", Descriptors: []Descriptor{{Key: "b", Policy: "per-ip"}, {Key: "c", Policy: "nope"}}}}},
		}}, `envoy.domains[1].descriptors[0].descriptors[1].policy: invalid envoy config: unknown policy "nope"`, true},
		{"error deep in a nested rule", one("edge", Descriptor{Key: "a", Descriptors: []Descriptor{{Key: "b", Descriptors: []Descriptor{{Key: ""}}}}}),
			"envoy.domains[0].descriptors[0].descriptors[0].descriptors[0].key: invalid envoy config: must not be empty", false},
		{"limit too large for Envoy", one("edge", Descriptor{Key: "k", Policy: "huge"}),
			`envoy.domains[0].descriptors[0].policy: invalid envoy config: policy "huge": limit 4294967296 (burst 0) exceeds 4294967295`, false},
		{"burst too large for Envoy", one("edge", Descriptor{Key: "k", Policy: "huge-burst"}),
			`policy "huge-burst": limit 10 (burst 4294967296) exceeds 4294967295`, false},
		{"all_or_nothing on a file's domain", Config{Domains: []Domain{{Domain: "edge", File: "edge.yaml", AllOrNothing: true}}},
			"edge.yaml: all_or_nothing: invalid envoy config: all_or_nothing belongs to quotad's config file", false},
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
	if err := matchConfig().Validate(policies); err != nil {
		t.Fatalf("the matching tests' config: %v", err)
	}
	if err := (Config{}).Validate(nil); err != nil {
		t.Fatalf("the zero config: %v", err)
	}
}

// one is a config of one domain with one rule.
func one(domain string, d Descriptor) Config {
	return Config{Domains: []Domain{{Domain: domain, Descriptors: []Descriptor{d}}}}
}

// Envoy's rate limit service cannot release slots, so a rule naming a
// concurrency policy is refused, in quotad's schema and as an
// envoyproxy/ratelimit file's quotad_policy.
func TestRefusesConcurrencyPolicies(t *testing.T) {
	jobs := []node.Policy{{Name: "jobs", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 5, Period: time.Minute}}}
	err := one("edge", Descriptor{Key: "k", Policy: "jobs"}).Validate(jobs)
	if err == nil || !strings.Contains(err.Error(), `envoy.domains[0].descriptors[0].policy: invalid envoy config: policy "jobs" is a concurrency limit, which needs its slots released (quotad's ReleaseSlot); Envoy's rate limit protocol cannot`) {
		t.Errorf("quotad's schema: got %v", err)
	}
	file := Config{Domains: []Domain{fileDomain("a.yaml", "edge", Descriptor{Key: "k", Line: 3, RateLimit: &RateLimit{Policy: "jobs"}})}}
	err = file.Validate(jobs)
	if err == nil || !strings.Contains(err.Error(), `a.yaml: line 3: descriptors[0].rate_limit.quotad_policy: invalid envoy config: policy "jobs" is a concurrency limit`) {
		t.Errorf("a file: got %v", err)
	}
}
