package envoy

import (
	"fmt"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// This file is the limit a request brings itself (a descriptor's limit
// field, which Envoy fills from its route's configuration), as
// envoyproxy/ratelimit takes it: in place of the rules' limit, counted in
// fixed windows of the unit like a rate_limit block.

// overrideRule is the rule of a descriptor of domain that carries its own
// limit o. Its statistics count under the domain's rule "(limit override)",
// labelled with the descriptor's entries (capped per domain, as
// detailed_metric).
func (t *ruleTable) overrideRule(domain string, o *rlscommonv3.RateLimitDescriptor_RateLimitOverride) (*rule, error) {
	// As envoyproxy/ratelimit, the unit is read by its number as the
	// answer's unit, so that 7 is WEEK, which Envoy's RateLimitUnit lacks.
	u, ok := fileUnits[rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit()).String()]
	if !ok {
		return nil, fmt.Errorf("limit.unit: %w: %s is not a unit: send SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR", errInvalidRequest, o.GetUnit())
	}
	r := &rule{
		limit:   currentLimit{requestsPerUnit: o.GetRequestsPerUnit(), unit: u.unit},
		period:  u.period,
		stat:    t.overrideStats[domain],
		charges: !t.stopIncrement,
	}
	if o.GetRequestsPerUnit() == 0 {
		r.blocked = true
		return r, nil
	}
	p, err := node.NewPolicy(node.Policy{Name: Namespace, Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: int64(o.GetRequestsPerUnit()), Period: u.period}})
	if err != nil {
		return nil, fmt.Errorf("limit: %w: %w", errInvalidRequest, err)
	}
	r.policy = p
	return r, nil
}

// overrideStatName is the rule name limit overrides count under.
const overrideStatName = "(limit override)"
