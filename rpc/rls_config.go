package rpc

import (
	"fmt"
	"math"

	"github.com/quotad/quotad/node"
)

// EnvoyConfig configures Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService), in the spirit of
// envoyproxy/ratelimit's descriptor configuration. The zero value configures
// nothing, and the service is then not served. It is a value: Validate and
// NewHandler only read it.
type EnvoyConfig struct {
	// Domains are the configured domains; names are unique.
	Domains []EnvoyDomain
}

// EnvoyDomain is the rule tree of one domain, the namespace Envoy names in
// every request (the ratelimit filter's domain).
type EnvoyDomain struct {
	// Domain is the name, non-empty.
	Domain string
	// Descriptors are the rules for a descriptor's first entry; at least
	// one. Among them, (Key, Value) pairs are unique.
	Descriptors []EnvoyDescriptor
}

// EnvoyDescriptor is one rule: it matches a descriptor entry, and says what
// limits a descriptor whose last entry it matches, and which rules match the
// entries after it.
//
// A rule with Policy, Unlimited or Descriptors set is valid; a rule with
// none of them would never apply to anything and is refused.
type EnvoyDescriptor struct {
	// Key must equal the entry's key; non-empty.
	Key string
	// Value must equal the entry's value. Empty means any value: the rule
	// is the key's default, used when no sibling rule names the entry's
	// value, and every value is counted separately.
	Value string
	// Policy is the name of the configured policy that limits descriptors
	// ending here. Empty means no limit here (nesting only). Its limit and
	// burst must fit Envoy's 32-bit counters (at most 4294967295).
	Policy string
	// Unlimited means descriptors ending here are never limited nor
	// counted. It excludes Policy.
	Unlimited bool
	// ShadowMode means descriptors ending here are decided and counted by
	// Policy, which it requires, but always answered OK: a way to try a
	// limit before enforcing it.
	ShadowMode bool
	// Descriptors are the rules for the next entry.
	Descriptors []EnvoyDescriptor
}

// Validate reports the first problem with c, naming the field as the
// config file spells it (e.g. envoy.domains[0].descriptors[1].policy), when
// policies are the configured policies. Its errors wrap ErrInvalidConfig,
// and node.ErrUnknownPolicy for a policy that is not among policies.
func (c EnvoyConfig) Validate(policies []node.Policy) error {
	_, err := compileRLS(c, lookupIn(policies))
	return err
}

// policyLookup finds a configured policy by name; node.(*Node).Policy is one.
type policyLookup func(name string) (node.Policy, bool)

// lookupIn finds policies among ps.
func lookupIn(ps []node.Policy) policyLookup {
	byName := make(map[string]node.Policy, len(ps))
	for _, p := range ps {
		byName[p.Name] = p
	}
	return func(name string) (node.Policy, bool) {
		p, ok := byName[name]
		return p, ok
	}
}

// rlsTable is a compiled EnvoyConfig: each domain's rule tree. It is
// immutable, and so safe for concurrent use.
type rlsTable struct {
	domains map[string]*rlsLevel
	// names are the domain names in configured order, for error messages.
	names []string
}

// rlsLevel is the rules for one entry of a descriptor: those naming a
// value, and the keys' defaults.
type rlsLevel struct {
	exact    map[rlsEntry]*rlsNode
	wildcard map[string]*rlsNode
}

type rlsEntry struct{ key, value string }

// rlsNode is one compiled EnvoyDescriptor.
type rlsNode struct {
	// rule applies to descriptors that end here; nil means none does.
	rule *rlsRule
	// next matches the following entry; nil means no rule goes deeper.
	next *rlsLevel
}

// rlsRule is what limits the descriptors that end at a node.
type rlsRule struct {
	// policy limits the descriptor; unset when unlimited.
	policy    node.Policy
	unlimited bool
	shadow    bool
}

// compileRLS validates c and builds its rule tree, resolving policies with
// lookup.
func compileRLS(c EnvoyConfig, lookup policyLookup) (rlsTable, error) {
	t := rlsTable{domains: make(map[string]*rlsLevel, len(c.Domains))}
	for i, d := range c.Domains {
		path := fmt.Sprintf("envoy.domains[%d]", i)
		if d.Domain == "" {
			return rlsTable{}, fmt.Errorf("%s.domain: %w: must not be empty", path, ErrInvalidConfig)
		}
		if _, dup := t.domains[d.Domain]; dup {
			return rlsTable{}, fmt.Errorf("%s.domain: %w: %q is configured twice", path, ErrInvalidConfig, d.Domain)
		}
		if len(d.Descriptors) == 0 {
			return rlsTable{}, fmt.Errorf("%s.descriptors: %w: domain %q has none", path, ErrInvalidConfig, d.Domain)
		}
		lvl, err := compileLevel(d.Descriptors, path, lookup)
		if err != nil {
			return rlsTable{}, err
		}
		t.domains[d.Domain] = lvl
		t.names = append(t.names, d.Domain)
	}
	return t, nil
}

// compileLevel compiles the rules ds, whose field path is parent +
// ".descriptors".
func compileLevel(ds []EnvoyDescriptor, parent string, lookup policyLookup) (*rlsLevel, error) {
	lvl := &rlsLevel{exact: map[rlsEntry]*rlsNode{}, wildcard: map[string]*rlsNode{}}
	for i, d := range ds {
		path := fmt.Sprintf("%s.descriptors[%d]", parent, i)
		if d.Key == "" {
			return nil, fmt.Errorf("%s.key: %w: must not be empty", path, ErrInvalidConfig)
		}
		n, err := compileNode(d, path, lookup)
		if err != nil {
			return nil, err
		}
		if d.Value == "" {
			if _, dup := lvl.wildcard[d.Key]; dup {
				return nil, fmt.Errorf("%s: %w: a rule for key %q with no value comes twice at this level", path, ErrInvalidConfig, d.Key)
			}
			lvl.wildcard[d.Key] = n
			continue
		}
		e := rlsEntry{d.Key, d.Value}
		if _, dup := lvl.exact[e]; dup {
			return nil, fmt.Errorf("%s: %w: a rule for %s=%s comes twice at this level", path, ErrInvalidConfig, d.Key, d.Value)
		}
		lvl.exact[e] = n
	}
	return lvl, nil
}

// compileNode compiles one rule and the rules below it.
func compileNode(d EnvoyDescriptor, path string, lookup policyLookup) (*rlsNode, error) {
	n := &rlsNode{}
	switch {
	case d.Unlimited && d.Policy != "":
		return nil, fmt.Errorf("%s: %w: policy %q and unlimited exclude each other", path, ErrInvalidConfig, d.Policy)
	case d.ShadowMode && d.Policy == "":
		return nil, fmt.Errorf("%s.shadow_mode: %w: needs a policy to decide with", path, ErrInvalidConfig)
	case d.Policy == "" && !d.Unlimited && len(d.Descriptors) == 0:
		return nil, fmt.Errorf("%s: %w: rule %s applies to nothing: set policy, unlimited or descriptors", path, ErrInvalidConfig, d.Key)
	case d.Unlimited:
		n.rule = &rlsRule{unlimited: true}
	case d.Policy != "":
		p, err := resolveRLSPolicy(d.Policy, lookup)
		if err != nil {
			return nil, fmt.Errorf("%s.policy: %w", path, err)
		}
		n.rule = &rlsRule{policy: p, shadow: d.ShadowMode}
	}
	if len(d.Descriptors) > 0 {
		next, err := compileLevel(d.Descriptors, path, lookup)
		if err != nil {
			return nil, err
		}
		n.next = next
	}
	return n, nil
}

// resolveRLSPolicy finds a rule's policy. A nil lookup resolves nothing:
// it is for checking the rules' shape alone (Config.Validate).
func resolveRLSPolicy(name string, lookup policyLookup) (node.Policy, error) {
	if lookup == nil {
		return node.Policy{Name: name}, nil
	}
	p, ok := lookup(name)
	if !ok {
		return node.Policy{}, fmt.Errorf("%w: %w %q: not among the configured policies", ErrInvalidConfig, node.ErrUnknownPolicy, name)
	}
	// Envoy's requests_per_unit and limit_remaining are 32-bit.
	if p.Limit.Limit > math.MaxUint32 || p.Limit.Capacity() > math.MaxUint32 {
		return node.Policy{}, fmt.Errorf("%w: policy %q: limit %d (burst %d) exceeds %d, the most Envoy's rate limit protocol can carry",
			ErrInvalidConfig, name, p.Limit.Limit, p.Limit.Burst, uint32(math.MaxUint32))
	}
	return p, nil
}
