package envoy

import (
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotad/quotad/node"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// This file is the compiled form of an EnvoyConfig, and the switch through
// which a running service takes a new one.

// EnvoyRules is a validated, compiled EnvoyConfig: every domain's rule tree,
// with its policies resolved. It is immutable, and so safe for concurrent
// use. Build it with CompileEnvoyRules.
type EnvoyRules struct {
	table rlsTable
}

// CompileEnvoyRules validates c and compiles it, resolving the policies its
// rules name among policies (the configured ones). Its errors are
// EnvoyConfig.Validate's. It is a pure function: hot reload calls it on the
// new configuration, then EnvoySwitch.Swap.
func CompileEnvoyRules(c EnvoyConfig, policies []node.Policy) (*EnvoyRules, error) {
	t, err := compileRLS(c, lookupIn(policies))
	if err != nil {
		return nil, err
	}
	return &EnvoyRules{table: t}, nil
}

// Domains returns the configured domains' names, in configured order.
func (r *EnvoyRules) Domains() []string {
	return append([]string(nil), r.table.names...)
}

// Serves reports whether r decides anything: it configures a domain, or is
// DropIn (every domain is then served). nil serves nothing.
func (r *EnvoyRules) Serves() bool {
	return r != nil && (len(r.table.domains) > 0 || r.table.dropIn)
}

// EnvoySwitch holds the rules Envoy's rate limit service decides with. Each
// request reads the rules once, so it is decided wholly by the rules before
// a Swap or wholly by those after, never by a mix. It is safe for
// concurrent use.
type EnvoySwitch struct {
	rules atomic.Pointer[EnvoyRules]
}

// NewEnvoySwitch returns a switch holding r; nil means no rules (no domain
// configured, not DropIn).
func NewEnvoySwitch(r *EnvoyRules) *EnvoySwitch {
	s := &EnvoySwitch{}
	s.Swap(r)
	return s
}

// Swap makes r the rules of every request that starts from now on, and
// returns the rules it replaces. Requests already running finish with the
// rules they started with. nil means no rules.
func (s *EnvoySwitch) Swap(r *EnvoyRules) *EnvoyRules {
	if r == nil {
		r = &EnvoyRules{}
	}
	return s.rules.Swap(r)
}

// Rules returns the rules in force.
func (s *EnvoySwitch) Rules() *EnvoyRules { return s.rules.Load() }

// rlsTable is each domain's rule tree and the service's settings.
type rlsTable struct {
	domains map[string]*rlsLevel
	// names are the domain names in configured order, for error messages.
	names []string
	// allOrNothing holds the domains whose requests are decided all or
	// nothing (EnvoyDomain.AllOrNothing).
	allOrNothing map[string]bool
	// dropIn, shadow and nearRatio are EnvoyConfig's DropIn, ShadowMode
	// and NearLimitRatio (defaulted).
	dropIn, shadow bool
	nearRatio      float64
}

// rlsLevel is the rules for one entry of a descriptor: those naming a
// value, those naming a value prefix (in configured order), and the keys'
// defaults.
type rlsLevel struct {
	exact    map[rlsEntry]*rlsNode
	prefixes []rlsPrefix
	defaults map[string]*rlsNode
}

type rlsEntry struct{ key, value string }

// rlsPrefix is a rule whose value ends in '*': it matches the key's values
// that start with prefix.
type rlsPrefix struct {
	key, prefix string
	node        *rlsNode
}

// rlsNode is one compiled EnvoyDescriptor.
type rlsNode struct {
	// rule applies to descriptors that end here; nil means none does.
	rule *rlsRule
	// next matches the following entry; nil means no rule goes deeper.
	next *rlsLevel
}

// rlsRule is what limits the descriptors that end at a node. Exactly one
// of unlimited, blocked and a policy says how.
type rlsRule struct {
	// policy limits the descriptor: a configured one, or the fixed window
	// of a rate_limit block (named EnvoyNamespace).
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
	// limit is the current_limit answered.
	limit rlsLimit
	// name is rate_limit.name, which other rules' replaces refer to;
	// replaces are the names this rule replaces.
	name     string
	replaces []string
	// stat names the rule in the statistics.
	stat rlsStatKey
}

// rlsLimit is a DescriptorStatus's current_limit.
type rlsLimit struct {
	name            string
	requestsPerUnit uint32
	unit            rlsv3.RateLimitResponse_RateLimit_Unit
	// multiplier is unit_multiplier; 0 or 1 leave it unset.
	multiplier uint32
}

func (l rlsLimit) proto() *rlsv3.RateLimitResponse_RateLimit {
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
// seconds has unit UNKNOWN. resolveRLSPolicy bounded the limit to 32 bits.
func policyLimit(p node.Policy, name string) rlsLimit {
	l := rlsLimit{name: name, requestsPerUnit: uint32(p.Limit.Limit)}
	var m *wrapperspb.UInt32Value
	l.unit, m = unitToProto(p.Limit.Period)
	l.multiplier = m.GetValue()
	return l
}
