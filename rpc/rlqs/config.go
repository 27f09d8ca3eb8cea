package rlqs

import (
	"errors"
	"fmt"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// This file is the rules' format: Config, its domains and their rules, and
// their validation against the configured policies.

// Defaults of Config.
const (
	// DefaultAssignmentInterval is Config.AssignmentInterval's default.
	DefaultAssignmentInterval = 2 * time.Second
	// DefaultAbandonAfter is Config.AbandonAfter's default.
	DefaultAbandonAfter = 5 * time.Minute
	// MaxAssignmentInterval is the longest AssignmentInterval.
	MaxAssignmentInterval = time.Hour
)

// The actions a rule may name instead of a policy.
const (
	// ActionAllowAll assigns ALLOW_ALL: the bucket is not limited.
	ActionAllowAll = "allow_all"
	// ActionDenyAll assigns DENY_ALL: every request of the bucket is
	// denied.
	ActionDenyAll = "deny_all"
)

// ErrInvalidConfig is what Validate's errors wrap.
var ErrInvalidConfig = errors.New("invalid rlqs config")

// Config configures the service. The zero value serves no domain. It is a
// value: Validate and New only read it.
type Config struct {
	// Domains are the domains Envoys name in their reports (the filter's
	// domain), each with its rules; names are unique.
	Domains []Domain
	// AssignmentInterval is the length of a round: every member
	// recomputes its Envoys' shares once a round, at the multiples of it
	// since the Unix epoch, and assignments live one second longer than
	// it. Whole seconds, 1s to MaxAssignmentInterval; 0 means
	// DefaultAssignmentInterval (2s).
	AssignmentInterval time.Duration
	// AbandonAfter is how long a bucket may report no requests before it
	// is abandoned (Envoy removes it, and creates it again on its next
	// request). At least AssignmentInterval; 0 means DefaultAbandonAfter
	// (5m).
	AbandonAfter time.Duration
}

// Domain is the rules of one domain.
type Domain struct {
	// Name is the domain: the rate_limit_quota filter's domain.
	Name string
	// Buckets are the rules, tried in order: the first whose Bucket
	// matches the bucket's id applies.
	Buckets []Rule
	// Default applies to a bucket no rule matches. Its zero value is
	// DENY_ALL.
	Default Target
}

// Rule applies its Target to the buckets whose id Bucket matches.
type Rule struct {
	// Bucket matches a bucket id that has each of its keys with a
	// matching value: the same value, or, when the value holds a `*`, a
	// value the pattern matches, each `*` standing for any run of
	// characters (`*` alone: any value). Keys of the id that Bucket does
	// not name do not matter; an empty Bucket matches every id.
	Bucket map[string]string
	Target
}

// Target is what a bucket gets: a policy's fair share, or an action.
// Exactly one of its fields is set (Default's zero value means DENY_ALL).
type Target struct {
	// Policy is a configured policy whose rate the buckets it applies to
	// share: each bucket id counts under its own key, and the Envoys
	// reporting one id share that key's rate. Its algorithm must be
	// token_bucket, leaky_bucket or gcra.
	Policy string
	// Action is ActionAllowAll or ActionDenyAll.
	Action string
}

// Serves reports whether c configures any domain.
func (c Config) Serves() bool { return len(c.Domains) > 0 }

// WithDefaults returns c with its zero settings defaulted.
func (c Config) WithDefaults() Config {
	if c.AssignmentInterval == 0 {
		c.AssignmentInterval = DefaultAssignmentInterval
	}
	if c.AbandonAfter == 0 {
		c.AbandonAfter = DefaultAbandonAfter
	}
	return c
}

// Validate checks c against the configured policies; an error starts with
// the field (domains[0].buckets[1].policy), wraps ErrInvalidConfig and
// says what to write instead.
func (c Config) Validate(policies []node.Policy) error {
	c = c.WithDefaults()
	if c.AssignmentInterval < time.Second || c.AssignmentInterval > MaxAssignmentInterval || c.AssignmentInterval%time.Second != 0 {
		return fmt.Errorf("assignment_interval: %w: %s: Envoy counts assignments' lives in whole seconds; write a whole number of seconds from 1s to %s", ErrInvalidConfig, c.AssignmentInterval, MaxAssignmentInterval)
	}
	if c.AbandonAfter < c.AssignmentInterval {
		return fmt.Errorf("abandon_after: %w: %s is shorter than assignment_interval %s; write at least %s", ErrInvalidConfig, c.AbandonAfter, c.AssignmentInterval, c.AssignmentInterval)
	}
	byName := map[string]node.Policy{}
	for _, p := range policies {
		byName[p.Name] = p
	}
	seen := map[string]int{}
	for i, d := range c.Domains {
		field := fmt.Sprintf("domains[%d]", i)
		if d.Name == "" {
			return fmt.Errorf("%s.domain: %w: missing; write the domain of Envoy's rate_limit_quota filter", field, ErrInvalidConfig)
		}
		if first, dup := seen[d.Name]; dup {
			return fmt.Errorf("%s.domain: %w: %q is also domains[%d]; write each domain once, with all its buckets", field, ErrInvalidConfig, d.Name, first)
		}
		seen[d.Name] = i
		for j, r := range d.Buckets {
			rf := fmt.Sprintf("%s.buckets[%d]", field, j)
			for k := range r.Bucket {
				if k == "" {
					return fmt.Errorf("%s.bucket: %w: an empty key; write the key of Envoy's bucket_id_builder", rf, ErrInvalidConfig)
				}
			}
			if err := r.Target.validate(rf, byName, false); err != nil {
				return err
			}
		}
		if err := d.Default.validate(field+".default", byName, true); err != nil {
			return err
		}
	}
	return nil
}

// validate checks t at field; zeroOK allows the zero Target (DENY_ALL).
func (t Target) validate(field string, policies map[string]node.Policy, zeroOK bool) error {
	switch {
	case t.Policy != "" && t.Action != "":
		return fmt.Errorf("%s: %w: both policy %q and action %q; write one of them", field, ErrInvalidConfig, t.Policy, t.Action)
	case t.Policy == "" && t.Action == "":
		if zeroOK {
			return nil
		}
		return fmt.Errorf("%s: %w: neither policy nor action; write a policy's name, or action: %s or %s", field, ErrInvalidConfig, ActionAllowAll, ActionDenyAll)
	case t.Action != "":
		if t.Action != ActionAllowAll && t.Action != ActionDenyAll {
			return fmt.Errorf("%s.action: %w: %q is not an action; write %s or %s", field, ErrInvalidConfig, t.Action, ActionAllowAll, ActionDenyAll)
		}
		return nil
	}
	p, ok := policies[t.Policy]
	if !ok {
		return fmt.Errorf("%s.policy: %w: %q is not a configured policy; add it to policies or name another", field, ErrInvalidConfig, t.Policy)
	}
	switch p.Limit.Algorithm {
	case algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.GCRA:
		return nil
	}
	return fmt.Errorf("%s.policy: %w: %q uses %s, but Envoy enforces an assignment as a token bucket refilled at a steady rate, which only token_bucket, leaky_bucket and gcra limit; give the policy one of those algorithms", field, ErrInvalidConfig, t.Policy, p.Limit.Algorithm)
}
