package envoy

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// ErrInvalidConfig is wrapped by every error Config.Validate, Compile and
// NewService return about what they were given.
var ErrInvalidConfig = errors.New("invalid rpc config")

// DefaultNearLimitRatio is Config.NearLimitRatio's default, as
// envoyproxy/ratelimit's NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// Namespace is the policy name under which rules with their own
// requests_per_unit (envoyproxy/ratelimit's files) count: their counters
// are the keys domain|key=value|... of the policy "envoy", so
// QuotaService.Reset can clear one.
const Namespace = "envoy"

// Config configures Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService). Its rules come in two
// schemas: quotad's (the config file's envoy section, whose rules name
// configured policies) and envoyproxy/ratelimit's (its config files,
// unchanged: rules carry rate_limit blocks). The zero value configures
// nothing: its rules serve nothing (Rules.Serves). It is a value: Validate
// and Compile only read it.
type Config struct {
	// Domains are the configured domains, of either schema; names are
	// unique across both.
	Domains []Domain
	// DropIn answers as envoyproxy/ratelimit does where quotad's own choices
	// differ: the rules serve even while no domain is configured (a rule
	// directory may start empty), and a request naming a domain that is not
	// configured gets OK for every descriptor (counted in
	// quotad.envoy.domain_not_found) instead of failing with
	// ErrUnknownDomain (NotFound on the wire).
	DropIn bool
	// ShadowMode is envoyproxy/ratelimit's SHADOW_MODE: decide and count as
	// usual, but answer overall_code OK where it would be OVER_LIMIT (the
	// descriptors' statuses are left as decided). Counted in
	// quotad.envoy.global_shadow_mode.
	ShadowMode bool
	// NearLimitRatio is the share of a limit above which hits count as
	// near_limit in the statistics, in (0, 1]. 0 means
	// DefaultNearLimitRatio (0.8).
	NearLimitRatio float64
}

// Domain is the rule tree of one domain, the namespace Envoy names in
// every request (the ratelimit filter's domain).
type Domain struct {
	// Domain is the name, non-empty.
	Domain string
	// File is the envoyproxy/ratelimit config file the domain comes from,
	// as errors should name it; empty for the rules of quotad's config file.
	// It selects the schema: with File, rules limit through RateLimit and
	// follow envoyproxy/ratelimit's rules (value wildcards, rules that limit
	// nothing); without, through Policy or Unlimited.
	File string
	// Descriptors are the rules for a descriptor's first entry. Among them,
	// (Key, Value) pairs are unique. quotad's schema requires at least one.
	Descriptors []Descriptor
	// AllOrNothing (quotad's schema only) decides the limited descriptors
	// of a request as one (node.CheckAll): either every one is within its
	// limit and spends its hits, or none spends. Off by default, as
	// envoyproxy/ratelimit, which spends on every descriptor that fits.
	// Descriptors of shadow_mode rules stay outside: they are decided on
	// their own and never deny the others.
	AllOrNothing bool
}

// Descriptor is one rule: it matches a descriptor entry, and says what
// limits a descriptor whose last entry it matches, and which rules match the
// entries after it.
//
// In quotad's schema, a rule with Policy, Unlimited or Descriptors set is
// valid; a rule with none of them would never apply to anything and is
// refused. In envoyproxy/ratelimit's, a rule with neither RateLimit nor
// Descriptors is valid and limits nothing (that project's "whitelisted").
type Descriptor struct {
	// Key must equal the entry's key; non-empty.
	Key string
	// Value must equal the entry's value. Empty means any value: the rule
	// is the key's default, used when no sibling rule matches the entry's
	// value, and every value is counted separately. In envoyproxy/ratelimit's
	// schema a value ending in '*' matches every value that starts with what
	// precedes it (only a trailing '*' is special), after the exact values
	// and before the default; among such rules the first written wins.
	Value string
	// Policy (quotad's schema) is the name of the configured policy that
	// limits descriptors ending here. Empty means no limit here (nesting
	// only). Its limit and burst must fit Envoy's 32-bit counters (at most
	// 4294967295).
	Policy string
	// Unlimited (quotad's schema) means descriptors ending here are never
	// limited nor counted. It excludes Policy.
	Unlimited bool
	// RateLimit (envoyproxy/ratelimit's schema) is the rule's rate_limit
	// block; nil means descriptors ending here are not limited.
	RateLimit *RateLimit
	// ShadowMode means descriptors ending here are decided and counted, but
	// always answered OK: a way to try a limit before enforcing it. quotad's
	// schema requires a Policy with it; envoyproxy/ratelimit's takes it
	// anywhere (it does nothing without a rate limit).
	ShadowMode bool
	// DetailedMetric (envoyproxy/ratelimit's schema) labels the rule's
	// statistics with the descriptor's actual entries, not only the rule
	// (capped: see docs/envoy.md).
	DetailedMetric bool
	// Line is where the rule starts in File, for error messages; 0 when
	// unknown.
	Line int
	// Descriptors are the rules for the next entry.
	Descriptors []Descriptor
}

// RateLimit is envoyproxy/ratelimit's rate_limit block: requests per
// unit of time, counted in fixed windows aligned to the Unix epoch, or no
// limit at all, or (quotad's extension) a configured policy.
type RateLimit struct {
	// Unit is second, minute, hour, day, week (7 days), month (30 days) or
	// year (365 days), in any letter case. Required unless Unlimited or
	// Policy is set; refused with Unlimited.
	Unit string
	// RequestsPerUnit is the limit per unit. nil (not written) means 0, as
	// in envoyproxy/ratelimit: every hit is over the limit.
	RequestsPerUnit *uint32
	// Unlimited means descriptors ending here are never limited, and
	// answered with limit_remaining 4294967295.
	Unlimited bool
	// Name is the limit's name: answered in current_limit.name, and what
	// other rules' Replaces refer to. Optional.
	Name string
	// Replaces are names of limits this one replaces: when one request
	// carries descriptors matching both, the named limits are neither
	// decided nor counted. Each is non-empty and not this limit's own Name.
	Replaces []string
	// Policy (the file's quotad_policy) names a configured policy that
	// limits instead: any algorithm, burst and failure mode. It excludes
	// Unit, RequestsPerUnit and Unlimited; its limit and burst must fit
	// Envoy's 32-bit counters.
	Policy string
}

// fileUnits are the units envoyproxy/ratelimit accepts, as it spells them
// (in upper case) and as long as it counts them.
var fileUnits = map[string]struct {
	period time.Duration
	unit   rlsv3.RateLimitResponse_RateLimit_Unit
}{
	"SECOND": {time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	"MINUTE": {time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	"HOUR":   {time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	"DAY":    {24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	"WEEK":   {7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	"MONTH":  {30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	"YEAR":   {365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
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
}

// compileTable validates c and builds its rule tree, resolving policies with
// lookup.
func compileTable(c Config, lookup policyLookup) (ruleTable, error) {
	t := ruleTable{
		domains: make(map[string]*ruleLevel, len(c.Domains)), dropIn: c.DropIn,
		shadow: c.ShadowMode, nearRatio: c.NearLimitRatio,
	}
	if r := c.NearLimitRatio; !(r >= 0 && r <= 1) {
		return ruleTable{}, fmt.Errorf("envoy near limit ratio: %w: %g is not in (0, 1]", ErrInvalidConfig, r)
	}
	if t.nearRatio == 0 {
		t.nearRatio = DefaultNearLimitRatio
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
		if first, dup := where[d.Domain]; dup {
			return ruleTable{}, fmt.Errorf("%s: %w: %q is configured twice (also in %s)", base.field("domain"), ErrInvalidConfig, d.Domain, first)
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
		cc := compiler{lookup: lookup, domain: d.Domain, file: d.File}
		lvl, err := cc.level(d.Descriptors, base, "")
		if err != nil {
			return ruleTable{}, err
		}
		t.domains[d.Domain] = lvl
		t.names = append(t.names, d.Domain)
		where[d.Domain] = here
	}
	return t, nil
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
		case cc.file != "" && strings.HasSuffix(d.Value, "*"):
			prefix := strings.TrimSuffix(d.Value, "*")
			for _, w := range lvl.prefixes {
				if w.key == d.Key && w.prefix == prefix {
					return nil, fmt.Errorf("%s: %w: a rule for %s=%s comes twice at this level", path, ErrInvalidConfig, d.Key, d.Value)
				}
			}
			lvl.prefixes = append(lvl.prefixes, prefixRule{key: d.Key, prefix: prefix, node: n})
		default:
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
	n := &ruleNode{rule: r}
	if r != nil {
		r.stat = newRuleStat(cc.domain, statKey, d.DetailedMetric)
	}
	if len(d.Descriptors) > 0 {
		next, err := cc.level(d.Descriptors, path, statKey)
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
	case d.DetailedMetric:
		return nil, fmt.Errorf("%s: %w: detailed_metric belongs to envoyproxy/ratelimit's files", path.field("detailed_metric"), ErrInvalidConfig)
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
		return &rule{policy: p, shadow: d.ShadowMode, limit: policyLimit(p, p.Name)}, nil
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
