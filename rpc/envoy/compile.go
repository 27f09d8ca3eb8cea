package envoy

import (
	"fmt"
	"math"
	"strings"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// This file compiles a Config into Rules: it validates every rule, resolves
// the policies they name, and builds each domain's rule tree.

// Compile validates c and compiles it, resolving the policies its rules
// name among policies (the configured ones). Its errors are
// Config.Validate's: they wrap ErrInvalidConfig. It is a pure function and
// does not block: hot reload calls it on the new configuration, then
// Switch.Swap.
func Compile(c Config, policies []node.Policy) (*Rules, error) {
	t, err := compileTable(c, lookupIn(policies))
	if err != nil {
		return nil, err
	}
	return &Rules{table: t}, nil
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

// fieldPath is where a rule or field is, as errors name it: the
// envoyproxy/ratelimit file and line when there is one, and the field path.
type fieldPath struct {
	file string
	line int
	path string
}

func (p fieldPath) String() string {
	s := p.path
	if p.line > 0 {
		s = fmt.Sprintf("line %d: %s", p.line, s)
	}
	if p.file != "" {
		s = p.file + ": " + s
	}
	return s
}

// field is the path of a field below p.
func (p fieldPath) field(name string) fieldPath {
	if p.path != "" {
		name = p.path + "." + name
	}
	return fieldPath{file: p.file, line: p.line, path: name}
}

// ruleKey is envoyproxy/ratelimit's name for a rule in its statistics:
// key, or key_value when the rule has a value.
func ruleKey(d Descriptor) string {
	if d.Value == "" {
		return d.Key
	}
	return d.Key + "_" + d.Value
}

// compiler holds what compiling one domain needs.
type compiler struct {
	lookup policyLookup
	domain string
	// file is the domain's Domain.File: the schema.
	file string
	// stopIncrement is Config.StopIncrementWhenOverLimit.
	stopIncrement bool
	// valueToMetric: a rule above set value_to_metric, so that the
	// statistics of the rules below carry their descriptors' values.
	valueToMetric bool
}

// compileTable validates c and builds its rule tree, resolving policies with
// lookup.
func compileTable(c Config, lookup policyLookup) (ruleTable, error) {
	t := ruleTable{
		domains: make(map[string]*ruleLevel, len(c.Domains)), dropIn: c.DropIn,
		shadow: c.ShadowMode, nearRatio: c.NearLimitRatio,
		quotaMode: c.QuotaMode, dynamicMetadata: c.DynamicMetadata, stopIncrement: c.StopIncrementWhenOverLimit,
		overrideStats: make(map[string]ruleStat, len(c.Domains)),
	}
	if r := c.NearLimitRatio; !(r >= 0 && r <= 1) {
		return ruleTable{}, fmt.Errorf("envoy near limit ratio: %w: %g is not in (0, 1]", ErrInvalidConfig, r)
	}
	if t.nearRatio == 0 {
		t.nearRatio = DefaultNearLimitRatio
	}
	if h := c.ResponseHeaders; h != nil {
		if err := h.validate(); err != nil {
			return ruleTable{}, err
		}
		names := *h
		t.headers = &names
	}
	// where says where each domain was configured, for duplicates.
	where := make(map[string]string, len(c.Domains))
	for i, d := range c.Domains {
		base := fieldPath{path: fmt.Sprintf("envoy.domains[%d]", i)}
		here := base.path + " of the config file"
		if d.File != "" {
			base = fieldPath{file: d.File}
			here = d.File
		}
		if d.Domain == "" {
			return ruleTable{}, fmt.Errorf("%s: %w: must not be empty", base.field("domain"), ErrInvalidConfig)
		}
		first, dup := where[d.Domain]
		if dup && !(c.MergeDomains && d.File != "" && t.fileDomains[d.Domain]) {
			how := ""
			if d.File != "" && t.fileDomains[d.Domain] {
				how = "; merge the files, or set MERGE_DOMAIN_CONFIG (--envoy-merge-domains)"
			}
			return ruleTable{}, fmt.Errorf("%s: %w: %q is configured twice (also in %s)%s", base.field("domain"), ErrInvalidConfig, d.Domain, first, how)
		}
		if len(d.Descriptors) == 0 && d.File == "" {
			return ruleTable{}, fmt.Errorf("%s: %w: domain %q has none", base.field("descriptors"), ErrInvalidConfig, d.Domain)
		}
		if d.AllOrNothing && d.File != "" {
			return ruleTable{}, fmt.Errorf("%s: %w: all_or_nothing belongs to quotad's config file; envoyproxy/ratelimit's files decide each descriptor on its own", base.field("all_or_nothing"), ErrInvalidConfig)
		}
		if d.AllOrNothing {
			if t.allOrNothing == nil {
				t.allOrNothing = map[string]bool{}
			}
			t.allOrNothing[d.Domain] = true
		}
		// An all-or-nothing domain spends on every descriptor or none, so
		// it charges nothing that does not fit.
		cc := compiler{lookup: lookup, domain: d.Domain, file: d.File, stopIncrement: c.StopIncrementWhenOverLimit || d.AllOrNothing}
		lvl, err := cc.level(d.Descriptors, base, "")
		if err != nil {
			return ruleTable{}, err
		}
		if dup {
			// MERGE_DOMAIN_CONFIG: this file's rules join the domain's.
			if err := mergeLevels(t.domains[d.Domain], lvl); err != nil {
				return ruleTable{}, fmt.Errorf("%s: %w: domain %q, also in %s: %w", base, ErrInvalidConfig, d.Domain, first, err)
			}
			where[d.Domain] = first + ", " + here
			continue
		}
		if d.File != "" {
			if t.fileDomains == nil {
				t.fileDomains = map[string]bool{}
			}
			t.fileDomains[d.Domain] = true
		}
		t.domains[d.Domain] = lvl
		t.overrideStats[d.Domain] = newRuleStat(d.Domain, overrideStatName, true)
		t.names = append(t.names, d.Domain)
		where[d.Domain] = here
	}
	return t, nil
}

// mergeLevels adds the rules of from to into, as envoyproxy/ratelimit
// merges a domain's files: a rule for the same key and value (or the same
// key's default, or wildcard) in both is refused; from's wildcards come
// after into's.
func mergeLevels(into, from *ruleLevel) error {
	for e, n := range from.exact {
		if _, dup := into.exact[e]; dup {
			return fmt.Errorf("a rule for %s=%s is in both", e.key, e.value)
		}
		into.exact[e] = n
	}
	for k, n := range from.defaults {
		if _, dup := into.defaults[k]; dup {
			return fmt.Errorf("a rule for key %q with no value is in both", k)
		}
		into.defaults[k] = n
	}
	for _, w := range from.wildcards {
		for _, have := range into.wildcards {
			if have.key == w.key && have.pattern == w.pattern {
				return fmt.Errorf("a rule for %s=%s is in both", w.key, w.pattern)
			}
		}
		into.wildcards = append(into.wildcards, w)
	}
	return nil
}

// level compiles the rules ds, whose parent is at parent; statKey is the
// parent's statistics name, "" at the top.
func (cc compiler) level(ds []Descriptor, parent fieldPath, statKey string) (*ruleLevel, error) {
	lvl := &ruleLevel{exact: map[entry]*ruleNode{}, defaults: map[string]*ruleNode{}}
	for i, d := range ds {
		path := parent.field(fmt.Sprintf("descriptors[%d]", i))
		if d.Line > 0 {
			path.line = d.Line
		}
		if d.Key == "" {
			return nil, fmt.Errorf("%s: %w: must not be empty", path.field("key"), ErrInvalidConfig)
		}
		key := ruleKey(d)
		if statKey != "" {
			key = statKey + "." + key
		}
		n, err := cc.node(d, path, key)
		if err != nil {
			return nil, err
		}
		switch {
		case d.Value == "":
			if _, dup := lvl.defaults[d.Key]; dup {
				return nil, fmt.Errorf("%s: %w: a rule for key %q with no value comes twice at this level", path, ErrInvalidConfig, d.Key)
			}
			lvl.defaults[d.Key] = n
		case cc.file != "" && strings.Contains(d.Value, "*"):
			if d.ShareThreshold {
				n.share = d.Value
			}
			for _, w := range lvl.wildcards {
				if w.key == d.Key && w.pattern == d.Value {
					return nil, fmt.Errorf("%s: %w: a rule for %s=%s comes twice at this level", path, ErrInvalidConfig, d.Key, d.Value)
				}
			}
			n.pattern = d.Value
			lvl.wildcards = append(lvl.wildcards, wildcardRule{key: d.Key, pattern: d.Value, parts: strings.Split(d.Value, "*"), node: n})
			// A wildcard is also found by its own text first, as
			// envoyproxy/ratelimit looks an entry's key_value up before it
			// tries wildcards: the value "a*" is the rule "a*", whatever
			// wildcard written before it matches "a*" too.
			lvl.exact[entry{d.Key, d.Value}] = n
		default:
			if d.ShareThreshold {
				return nil, fmt.Errorf("%s: %w: share_threshold takes a wildcard value (one with '*'), whose matches then share one limit; %q has none", path.field("share_threshold"), ErrInvalidConfig, d.Value)
			}
			e := entry{d.Key, d.Value}
			if _, dup := lvl.exact[e]; dup {
				return nil, fmt.Errorf("%s: %w: a rule for %s=%s comes twice at this level", path, ErrInvalidConfig, d.Key, d.Value)
			}
			lvl.exact[e] = n
		}
	}
	return lvl, nil
}

// node compiles one rule, at path with statistics name statKey, and the
// rules below it.
func (cc compiler) node(d Descriptor, path fieldPath, statKey string) (*ruleNode, error) {
	var (
		r   *rule
		err error
	)
	if cc.file == "" {
		r, err = cc.quotadRule(d, path)
	} else {
		r, err = cc.fileRule(d, path)
	}
	if err != nil {
		return nil, err
	}
	n := &ruleNode{rule: r, valueToMetric: d.ValueToMetric}
	below := cc
	below.valueToMetric = cc.valueToMetric || d.ValueToMetric
	if r != nil {
		// detailed_metric takes precedence over value_to_metric, as in
		// envoyproxy/ratelimit.
		byValue := below.valueToMetric && !d.DetailedMetric
		r.stat = newRuleStat(cc.domain, statKey, d.DetailedMetric || byValue)
		r.stat.byValue = byValue
		r.quota, r.metadata = d.QuotaMode, d.Metadata
	}
	if len(d.Descriptors) > 0 {
		next, err := below.level(d.Descriptors, path, statKey)
		if err != nil {
			return nil, err
		}
		n.next = next
	}
	return n, nil
}

// quotadRule compiles the limit of a rule of quotad's schema; nil when the
// rule only nests.
func (cc compiler) quotadRule(d Descriptor, path fieldPath) (*rule, error) {
	switch {
	case d.RateLimit != nil:
		return nil, fmt.Errorf("%s: %w: rate_limit belongs to envoyproxy/ratelimit's files; name a policy", path.field("rate_limit"), ErrInvalidConfig)
	case d.DetailedMetric || d.ValueToMetric || d.ShareThreshold || d.QuotaMode || d.Metadata != nil:
		return nil, fmt.Errorf("%s: %w: detailed_metric, value_to_metric, share_threshold, quota_mode and metadata belong to envoyproxy/ratelimit's files", path, ErrInvalidConfig)
	case d.Unlimited && d.Policy != "":
		return nil, fmt.Errorf("%s: %w: policy %q and unlimited exclude each other", path, ErrInvalidConfig, d.Policy)
	case d.ShadowMode && d.Policy == "":
		return nil, fmt.Errorf("%s: %w: needs a policy to decide with", path.field("shadow_mode"), ErrInvalidConfig)
	case d.Policy == "" && !d.Unlimited && len(d.Descriptors) == 0:
		return nil, fmt.Errorf("%s: %w: rule %s applies to nothing: set policy, unlimited or descriptors", path, ErrInvalidConfig, d.Key)
	case d.Unlimited:
		return &rule{unlimited: true}, nil
	case d.Policy != "":
		p, err := resolvePolicy(d.Policy, cc.lookup)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path.field("policy"), err)
		}
		// Every hit counts here too, as envoyproxy/ratelimit counts it
		// (any algorithm charges: State.Charge), unless
		// StopIncrementWhenOverLimit or the domain is all or nothing.
		return &rule{policy: p, shadow: d.ShadowMode, limit: policyLimit(p, p.Name), charges: !cc.stopIncrement}, nil
	}
	return nil, nil
}

// fileRule compiles the limit of a rule of envoyproxy/ratelimit's schema;
// nil when it has none.
func (cc compiler) fileRule(d Descriptor, path fieldPath) (*rule, error) {
	if d.Policy != "" || d.Unlimited {
		return nil, fmt.Errorf("%s: %w: policy and unlimited belong to quotad's config file; use rate_limit", path, ErrInvalidConfig)
	}
	rl := d.RateLimit
	if rl == nil {
		return nil, nil
	}
	rp := path.field("rate_limit")
	for i, name := range rl.Replaces {
		switch {
		case name == "":
			return nil, fmt.Errorf("%s: %w: a replaced limit needs a name", rp.field(fmt.Sprintf("replaces[%d].name", i)), ErrInvalidConfig)
		case name == rl.Name:
			return nil, fmt.Errorf("%s: %w: limit %q cannot replace itself", rp.field(fmt.Sprintf("replaces[%d].name", i)), ErrInvalidConfig, name)
		}
	}
	r := &rule{shadow: d.ShadowMode, name: rl.Name, replaces: rl.Replaces}
	switch {
	case rl.Policy != "":
		if rl.Unit != "" || rl.RequestsPerUnit != nil || rl.Unlimited {
			return nil, fmt.Errorf("%s: %w: quotad_policy %q says how to limit; it excludes unit, requests_per_unit and unlimited", rp, ErrInvalidConfig, rl.Policy)
		}
		p, err := resolvePolicy(rl.Policy, cc.lookup)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rp.field("quotad_policy"), err)
		}
		name := rl.Name
		if name == "" {
			name = p.Name
		}
		r.policy, r.limit = p, policyLimit(p, name)
		// Any algorithm charges (State.Charge), as a rate_limit block does.
		r.charges = !cc.stopIncrement
	case rl.Unlimited:
		if rl.Unit != "" {
			return nil, fmt.Errorf("%s: %w: an unlimited rate limit takes no unit (as in envoyproxy/ratelimit)", rp.field("unit"), ErrInvalidConfig)
		}
		r.unlimited = true
	default:
		u, ok := fileUnits[strings.ToUpper(rl.Unit)]
		if !ok {
			return nil, fmt.Errorf("%s: %w: %q is not a unit: write second, minute, hour, day, week, month or year", rp.field("unit"), ErrInvalidConfig, rl.Unit)
		}
		var rpu uint32
		if rl.RequestsPerUnit != nil {
			rpu = *rl.RequestsPerUnit
		}
		r.limit = currentLimit{name: rl.Name, requestsPerUnit: rpu, unit: u.unit}
		r.period = u.period
		if rpu == 0 {
			// No window admits anything: decided without the store.
			r.blocked = true
			break
		}
		// Built once, here, so that checks trust it (node.NewPolicy). Any
		// requests_per_unit in a unit is a valid fixed window; an error
		// would be a bug, reported as the rule's.
		p, err := node.NewPolicy(node.Policy{Name: Namespace, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: int64(rpu), Period: u.period}})
		if err != nil {
			return nil, fmt.Errorf("%s: %w: %w", rp.field("requests_per_unit"), ErrInvalidConfig, err)
		}
		r.policy = p
		// As envoyproxy/ratelimit's INCRBY: hits count even when they do
		// not fit, unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT.
		r.charges = !cc.stopIncrement
	}
	return r, nil
}

// resolvePolicy finds a rule's policy with lookup, and checks that Envoy's
// protocol can carry it.
func resolvePolicy(name string, lookup policyLookup) (node.Policy, error) {
	p, ok := lookup(name)
	if !ok {
		return node.Policy{}, fmt.Errorf("%w: %w %q: not among the configured policies", ErrInvalidConfig, node.ErrUnknownPolicy, name)
	}
	if p.Limit.Algorithm == algorithms.Concurrency {
		// Envoy's protocol has no release: every slot would stay held for a
		// whole period, a rate limit in disguise.
		return node.Policy{}, fmt.Errorf("%w: policy %q is a concurrency limit, which needs its slots released (quotad's ReleaseSlot); Envoy's rate limit protocol cannot", ErrInvalidConfig, name)
	}
	// Envoy's requests_per_unit and limit_remaining are 32-bit.
	if p.Limit.Limit > math.MaxUint32 || p.Limit.Capacity() > math.MaxUint32 {
		return node.Policy{}, fmt.Errorf("%w: policy %q: limit %d (burst %d) exceeds %d, the most Envoy's rate limit protocol can carry",
			ErrInvalidConfig, name, p.Limit.Limit, p.Limit.Burst, uint32(math.MaxUint32))
	}
	return p, nil
}

// Validate reports the first problem with c, naming the field as the
// config file spells it (e.g. envoy.domains[0].descriptors[1].policy), or
// the envoyproxy/ratelimit file, line and descriptor path
// (edge.yaml: line 7: descriptors[0].rate_limit.unit), when policies are
// the configured policies. Its errors wrap ErrInvalidConfig, and
// node.ErrUnknownPolicy for a policy that is not among policies.
func (c Config) Validate(policies []node.Policy) error {
	_, err := compileTable(c, lookupIn(policies))
	return err
}
