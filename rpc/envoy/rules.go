package envoy

import (
	"strings"

	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotad/quotad/node"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// This file is the compiled form of a Config, and the switch through
// which a running service takes a new one.

// Rules is a validated, compiled Config: every domain's rule tree, with its
// policies resolved (each rule keeps its own copy of its policy). It is
// immutable, and so safe for concurrent use. Build it with Compile; nil, and
// the zero value, hold no domain and are not DropIn.
type Rules struct {
	table ruleTable
}

// Domains returns the configured domains' names, in configured order: a
// new slice, nil for nil Rules.
func (r *Rules) Domains() []string {
	if r == nil {
		return nil
	}
	return append([]string(nil), r.table.names...)
}

// Serves reports whether r decides anything: it configures a domain, or is
// DropIn (every domain is then served). nil serves nothing. A server that
// does not serve Envoy's rate limit service takes only rules that serve
// nothing (rpc's Handler.SetRules).
func (r *Rules) Serves() bool {
	return r != nil && (len(r.table.domains) > 0 || r.table.dropIn)
}

// Switch holds the rules Envoy's rate limit service decides with. Each
// request reads the rules once, so it is decided wholly by the rules before
// a Swap or wholly by those after, never by a mix. The zero value holds no
// rules. It is safe for concurrent use.
type Switch struct {
	rules atomic.Pointer[Rules]
}

// NewSwitch returns a switch holding r; nil means no rules (no domain
// configured, not DropIn): every domain is then unknown.
func NewSwitch(r *Rules) *Switch {
	s := &Switch{}
	s.Swap(r)
	return s
}

// Swap makes r the rules of every request that starts from now on, and
// returns the rules it replaces. Requests already running finish with the
// rules they started with. nil means no rules.
func (s *Switch) Swap(r *Rules) *Rules {
	if r == nil {
		r = &Rules{}
	}
	return s.rules.Swap(r)
}

// Rules returns the rules in force, never nil: empty ones for a zero
// Switch.
func (s *Switch) Rules() *Rules {
	if r := s.rules.Load(); r != nil {
		return r
	}
	return &Rules{}
}

// ruleTable is each domain's rule tree and the service's settings.
type ruleTable struct {
	domains map[string]*ruleLevel
	// names are the domain names in configured order, for error messages.
	names []string
	// allOrNothing holds the domains whose requests are decided all or
	// nothing (Domain.AllOrNothing).
	allOrNothing map[string]bool
	// dropIn, shadow and nearRatio are Config's DropIn, ShadowMode
	// and NearLimitRatio (defaulted).
	dropIn, shadow bool
	nearRatio      float64
	// headers is Config's ResponseHeaders (nil: none).
	headers *ResponseHeaders
	// quotaMode and dynamicMetadata are Config's QuotaMode and
	// DynamicMetadata; stopIncrement its StopIncrementWhenOverLimit.
	quotaMode, dynamicMetadata, stopIncrement bool
	// overrideStats are the statistics of each domain's limit overrides
	// (overrideRule).
	overrideStats map[string]ruleStat
	// fileDomains are the domains of envoyproxy/ratelimit's files, which
	// Config.MergeDomains may merge.
	fileDomains map[string]bool
}

// ruleLevel is the rules for one entry of a descriptor: those naming a
// value, those whose value has wildcards (in configured order), and the
// keys' defaults.
type ruleLevel struct {
	exact     map[entry]*ruleNode
	wildcards []wildcardRule
	defaults  map[string]*ruleNode
}

// wildcardRule is a rule whose value has a '*' (envoyproxy/ratelimit's
// files): each '*' stands for any run of characters, none included, so
// "foo*" matches the key's values that start with "foo" and "bar*b" those
// that start with "bar" and end in "b". parts is the value split at each
// '*', once, when compiled.
type wildcardRule struct {
	key, pattern string
	parts        []string
	node         *ruleNode
}

// matches reports whether value matches the rule's pattern: it starts with
// the first part and ends with the last, and the parts between occur in
// order, without overlapping, in what is left. Trying the leftmost place
// of each middle part first loses no match, so one pass decides it.
func (w wildcardRule) matches(value string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// ruleNode is one compiled Descriptor.
type ruleNode struct {
	// rule applies to descriptors that end here; nil means none does.
	rule *rule
	// next matches the following entry; nil means no rule goes deeper.
	next *ruleLevel
	// share, when set, is the wildcard pattern of a share_threshold rule:
	// the entry it matches is counted under the pattern, not its value.
	share string
	// pattern is a wildcard rule's value ("read*"); valueToMetric its
	// value_to_metric: both name the entry in the statistics
	// (ruleLevel.metricPath).
	pattern       string
	valueToMetric bool
}

// rule is what limits the descriptors that end at a node. Exactly one
// of unlimited, blocked and a policy says how.
type rule struct {
	// policy limits the descriptor: a configured one, or the fixed window
	// of a rate_limit block (named Namespace).
	policy node.Policy
	// unlimited descriptors are never limited.
	unlimited bool
	// blocked (requests_per_unit 0) descriptors are always over the limit,
	// decided without the store; period is their window, for
	// duration_until_reset.
	blocked bool
	period  time.Duration
	// shadow answers OK whatever the decision.
	shadow bool
	// quota is quota_mode: a soft limit (Descriptor.QuotaMode).
	quota bool
	// metadata goes into the answer's dynamic metadata when the
	// descriptor is within its limit (Config.DynamicMetadata).
	metadata *structpb.Struct
	// charges counts hits even when they do not fit (node.CheckOptions.
	// Charge), as envoyproxy/ratelimit counts them: every limited rule,
	// unless Config.StopIncrementWhenOverLimit or its domain is all or
	// nothing.
	charges bool
	// limit is the current_limit answered.
	limit currentLimit
	// name is rate_limit.name, which other rules' replaces refer to;
	// replaces are the names this rule replaces.
	name     string
	replaces []string
	// stat names the rule in the statistics.
	stat ruleStat
}

// currentLimit is a DescriptorStatus's current_limit.
type currentLimit struct {
	name            string
	requestsPerUnit uint32
	unit            rlsv3.RateLimitResponse_RateLimit_Unit
	// multiplier is unit_multiplier; 0 or 1 leave it unset.
	multiplier uint32
}

func (l currentLimit) proto() *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: l.name, RequestsPerUnit: l.requestsPerUnit, Unit: l.unit}
	if l.multiplier > 1 {
		rl.UnitMultiplier = wrapperspb.UInt32(l.multiplier)
	}
	return rl
}

// policyLimit describes p's limit the way Envoy does, named name: requests
// per unit of time. The rate is the policy's limit per period (a bucket's
// burst may hold more). The period is given in the longest of Envoy's units
// that divides it, times unit_multiplier when that is more than 1 (30s is 1
// SECOND × 30; 1h is 1 HOUR); a period that is not a whole number of
// seconds has unit UNKNOWN. resolvePolicy bounded the limit to 32 bits.
func policyLimit(p node.Policy, name string) currentLimit {
	l := currentLimit{name: name, requestsPerUnit: uint32(p.Limit.Limit)}
	var m *wrapperspb.UInt32Value
	l.unit, m = unitToProto(p.Limit.Period)
	l.multiplier = m.GetValue()
	return l
}

// check is what deciding one descriptor takes. Every descriptor of a
// request is planned before any is decided, so that a malformed descriptor
// fails the request before anything is spent.
type check struct {
	// rule applies to the descriptor; nil when none does.
	rule *rule
	// entries are the descriptor's as counted (a share_threshold rule's
	// pattern for the value it matched), for the key and the detailed
	// statistics.
	entries []entry
	// path is the rule's name with value_to_metric's runtime values, for
	// the statistics of a value_to_metric rule; "" otherwise.
	path string
	// key names the descriptor's counter under rule.policy.
	key string
	// hits is what the descriptor asks to spend; cost is what the check
	// spends, hits or (over the capacity) 0.
	hits uint64
	cost int64
	// overCapacity means the hits exceed what the policy can ever admit:
	// the descriptor is over its limit, and cost is 0 so that the check
	// reads the counter without spending.
	overCapacity bool
}

// unitToProto expresses period as an Envoy unit times a multiplier; the
// multiplier is nil when it is 1, and the unit UNKNOWN when no unit divides
// period.
func unitToProto(period time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, *wrapperspb.UInt32Value) {
	const day = 24 * time.Hour
	// Envoy counts a month as 30 days and a year as 365 days.
	units := [...]struct {
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		d    time.Duration
	}{
		{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * day},
		{rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * day},
		{rlsv3.RateLimitResponse_RateLimit_DAY, day},
		{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour},
		{rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
		{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
	}
	for _, u := range units {
		if period <= 0 || period%u.d != 0 {
			continue
		}
		// Periods are at most algorithms.MaxPeriod (365 days), so the
		// multiplier fits easily.
		m := period / u.d
		if m == 1 {
			return u.unit, nil
		}
		return u.unit, wrapperspb.UInt32(uint32(m))
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, nil
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
