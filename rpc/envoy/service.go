package envoy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/node"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// This file serves Envoy's rate limit service: ShouldRateLimit decides each
// descriptor of a request with the rule its entries match (match.go) and
// the node's Check.

// NewService returns Envoy's rate limit service on node n, deciding with
// the rules that rules holds at each request, which carries 1 to
// maxDescriptors descriptors; its statistics (stats.go) go to mp, nil
// meaning nowhere. n and rules must not be nil and maxDescriptors must be
// at least 1, else the error wraps ErrInvalidConfig; any other error is
// mp's. It does not block.
func NewService(n *node.Node, rules *Switch, maxDescriptors int, mp metric.MeterProvider) (*Service, error) {
	if n == nil || rules == nil || maxDescriptors < 1 {
		return nil, fmt.Errorf("envoy service: %w: needs a node, a switch of rules and maxDescriptors >= 1 (got %d)", ErrInvalidConfig, maxDescriptors)
	}
	st, err := newStats(mp)
	if err != nil {
		return nil, err
	}
	return &Service{node: n, rules: rules, maxDescriptors: maxDescriptors, stats: st, now: time.Now}, nil
}

// Service is Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) on a node, whatever the
// wire: package rpc serves it on its front ends. Build it with NewService.
// It is safe for concurrent use.
type Service struct {
	node *node.Node
	// rules are read once per request; their owner swaps in new ones (rpc's
	// Handler.SetRules).
	rules *Switch
	// maxDescriptors bounds the descriptors of one request, like a batch.
	maxDescriptors int
	stats          *stats
	// now is the clock of blocked rules' windows.
	now func() time.Time
}

// ShouldRateLimit decides req as RateLimitService.ShouldRateLimit does: one
// status per descriptor, in order, and the overall code. Every descriptor
// is decided, even after one is over its limit, and spends its hits if it
// fits, as in envoyproxy/ratelimit (unless its domain is AllOrNothing). The
// whole request is decided by one set of rules, even while a new one is
// swapped in.
//
// It fails the whole request, before anything is spent, when req is
// malformed (the error wraps node.ErrInvalidInput and names the field, e.g.
// "descriptors[1].entries[0].value: invalid request: ...") or names a
// domain the rules do not serve (ErrUnknownDomain). A store failure is not
// an error (each policy's failure mode decides, as in node.Node.Check); the
// node's errors (node.ErrStoreFull, the context ending) fail the request
// naming the descriptor, and what earlier descriptors spent stays spent.
// These are plain errors: the wire chooses their codes. It blocks while the
// node asks the store, bounded by ctx and the store's timeout.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	t := &s.rules.Rules().table
	checks, err := s.plan(ctx, t, req)
	if err != nil {
		return nil, err
	}
	res := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(checks)),
	}
	if t.allOrNothing[req.GetDomain()] {
		if err := s.decideAll(ctx, t, checks, res.Statuses); err != nil {
			return nil, err
		}
	}
	// As envoyproxy/ratelimit: the request is over the limit if a
	// descriptor is over a rule that is not in quota mode, or if it has
	// quota-mode descriptors and every one of them is over.
	quota := make([]bool, len(checks))
	overHard, overQuota, quotas := 0, 0, 0
	for i, c := range checks {
		st := res.Statuses[i]
		if st == nil {
			if st, err = s.decide(ctx, t, c); err != nil {
				return nil, fmt.Errorf("descriptors[%d]: %w", i, err)
			}
			res.Statuses[i] = st
		}
		// As envoyproxy/ratelimit, a descriptor of an unlimited rule is no
		// quota: its OK must not keep the quotas that are over from
		// making the request over.
		quota[i] = (t.quotaMode || (c.rule != nil && c.rule.quota)) && (c.rule == nil || !c.rule.unlimited)
		over := st.Code == rlsv3.RateLimitResponse_OVER_LIMIT
		switch {
		case quota[i]:
			quotas++
			if over {
				overQuota++
			}
		case over:
			overHard++
		}
	}
	if overHard > 0 || (quotas > 0 && overQuota == quotas) {
		res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if t.headers != nil {
		res.ResponseHeadersToAdd = t.headers.of(res.Statuses, quota)
	}
	if t.dynamicMetadata {
		res.DynamicMetadata = dynamicMetadata(req, checks, res.Statuses)
	}
	if t.shadow && res.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		// As envoyproxy/ratelimit's SHADOW_MODE: Envoy acts on the overall
		// code; the statuses still say what was decided.
		res.OverallCode = rlsv3.RateLimitResponse_OK
		s.stats.globalShadowMode.Add(ctx, 1)
	}
	return res, nil
}

// plan validates req and plans each of its descriptors with the rules t.
func (s *Service) plan(ctx context.Context, t *ruleTable, req *rlsv3.RateLimitRequest) ([]check, error) {
	domain := req.GetDomain()
	if domain == "" {
		return nil, fmt.Errorf("domain: %w: must not be empty", errInvalidRequest)
	}
	ds := req.GetDescriptors()
	if n := len(ds); n == 0 || n > s.maxDescriptors {
		return nil, fmt.Errorf("descriptors: %w: %d descriptors; send 1 to %d", errInvalidRequest, n, s.maxDescriptors)
	}
	root, ok := t.domains[domain]
	if !ok {
		if !t.dropIn {
			return nil, fmt.Errorf("domain: %w %q: not configured on this server (configured: %s)", ErrUnknownDomain, domain, strings.Join(t.names, ", "))
		}
		// As envoyproxy/ratelimit: no rule applies to anything (root is
		// nil), but the descriptors must still be well formed.
		s.stats.domainNotFound.Add(ctx, 1)
	}
	// A request's hits_addend of 0 means unset, that is 1.
	hits := max(1, uint64(req.GetHitsAddend()))
	checks := make([]check, len(ds))
	var replaced map[string]bool
	for i, d := range ds {
		c, err := planDescriptor(t, root, domain, d, hits)
		if err != nil {
			return nil, fmt.Errorf("descriptors[%d].%w", i, err)
		}
		checks[i] = c
		if c.rule != nil && len(c.rule.replaces) > 0 {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			for _, name := range c.rule.replaces {
				replaced[name] = true
			}
		}
	}
	// A limit that another descriptor's rule replaces is neither decided
	// nor counted.
	for i, c := range checks {
		if c.rule != nil && c.rule.name != "" && replaced[c.rule.name] {
			checks[i] = check{}
		}
	}
	return checks, nil
}

// planDescriptor validates d and plans its check with the rules root (nil:
// none apply). requestHits is the request's hits_addend, already defaulted.
// Errors start with the field name, relative to the descriptor.
func planDescriptor(t *ruleTable, root *ruleLevel, domain string, d *rlscommonv3.RateLimitDescriptor, requestHits uint64) (check, error) {
	if d.GetIsNegativeHits() {
		return check{}, fmt.Errorf("is_negative_hits: %w: quotad does not refund hits", errInvalidRequest)
	}
	// As envoyproxy/ratelimit, a descriptor no rule can match is answered
	// OK rather than failing the whole request (Envoy would then apply
	// failure_mode_deny to every descriptor): one without entries, or with
	// an empty key (no rule has one). An empty value is a value: the key's
	// default rule, or a wildcard, may match it.
	pes := d.GetEntries()
	es := make([]entry, len(pes))
	for j, pe := range pes {
		es[j] = entry{key: pe.GetKey(), value: pe.GetValue()}
		if es[j].key == "" {
			return check{}, nil
		}
	}
	if len(es) == 0 {
		return check{}, nil
	}
	hits := requestHits
	if h := d.GetHitsAddend(); h != nil {
		// Unlike the request's, a descriptor's 0 is a value: check, do not
		// spend.
		hits = h.GetValue()
	}
	r, counted := root.matchCounted(es)
	if o := d.GetLimit(); o != nil && root != nil {
		// As envoyproxy/ratelimit: a limit the request brings replaces
		// the rules' (within a configured domain), whatever matched.
		var err error
		if r, err = t.overrideRule(domain, o); err != nil {
			return check{}, err
		}
		counted = es
	}
	c := check{rule: r, entries: counted, hits: hits}
	if r != nil && r.stat.byValue && d.GetLimit() == nil {
		c.path = root.metricPath(es)
	}
	if r == nil || r.unlimited || r.blocked {
		return c, nil
	}
	c.key = counterKey(domain, counted)
	if err := node.ValidateKey(c.key); err != nil {
		return check{}, fmt.Errorf("entries: the domain and entries make the rate limit's %w", err)
	}
	// A cost above the capacity can never be admitted: Envoy's protocol
	// calls that over the limit, where quotad's own API calls it invalid.
	// A charge counts it all the same, up to the most a key may owe
	// (Limit.MaxCharge): a counter charged more stays at that.
	if capacity := r.policy.Limit.Capacity(); hits > uint64(capacity) && !r.charges {
		c.overCapacity = true
		return c, nil
	}
	c.cost = int64(min(hits, uint64(r.policy.Limit.MaxCharge())))
	return c, nil
}

// decide checks one planned descriptor with the node, and counts it in the
// statistics; t is the rules it was planned with.
func (s *Service) decide(ctx context.Context, t *ruleTable, c check) (*rlsv3.RateLimitResponse_DescriptorStatus, error) {
	r := c.rule
	switch {
	case r == nil:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}, nil
	case r.unlimited:
		s.stats.record(ctx, r.stat, r.unlimited, r.shadow, c.entries, c.path, t.nearRatio, outcome{hits: c.hits})
		// As envoyproxy/ratelimit answers for unlimited rules.
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}, nil
	case r.blocked:
		s.stats.record(ctx, r.stat, r.unlimited, r.shadow, c.entries, c.path, t.nearRatio, outcome{hits: c.hits, over: true})
		// The window as envoyproxy/ratelimit aligns it: to the Unix epoch.
		p := int64(r.period)
		return s.status(r, true, 0, time.Duration(p-s.now().UnixNano()%p)), nil
	}
	res, err := s.node.CheckWith(ctx, r.policy, c.key, c.cost, node.CheckOptions{Charge: r.charges})
	if err != nil {
		return nil, err
	}
	over := !res.Allowed || c.overCapacity
	return s.answer(ctx, t, c, res, over, !over), nil
}

// answer is the status of descriptor c, which the node decided as res, and
// counts it in the statistics; over says whether c is over its limit, spent
// whether its cost was spent (neither: it fitted, but an all_or_nothing
// request spent nothing).
func (s *Service) answer(ctx context.Context, t *ruleTable, c check, res node.Result, over, spent bool) *rlsv3.RateLimitResponse_DescriptorStatus {
	limit, remaining := uint64(max(res.Limit, 0)), uint64(max(res.Remaining, 0))
	o := outcome{hits: c.hits, limit: limit, over: over, unspent: !over && !spent}
	// The counter before the hits: a denial spent nothing, an admission
	// spent the cost.
	o.before = limit - min(remaining, limit)
	if spent {
		o.before -= min(o.before, uint64(c.cost))
	}
	s.stats.record(ctx, c.rule.stat, c.rule.unlimited, c.rule.shadow, c.entries, c.path, t.nearRatio, o)
	// Remaining is at most the capacity, which resolvePolicy bounded to
	// 32 bits.
	return s.status(c.rule, over, uint32(remaining), res.ResetAfter)
}

// decideAll decides the limited descriptors of an all_or_nothing domain's
// request as one, and sets their statuses in sts; it leaves the others
// (no rule, unlimited, shadow_mode) nil, to be decided on their own. A
// descriptor of a blocked rule (requests_per_unit 0), or whose hits, alone
// or with those of other descriptors of the same counter, exceed what its
// limit can ever admit, makes the request over the limit before anything
// is spent: the others are then only read (a check of cost 0).
func (s *Service) decideAll(ctx context.Context, t *ruleTable, checks []check, sts []*rlsv3.RateLimitResponse_DescriptorStatus) error {
	type counter struct {
		p   node.Policy
		key string
	}
	var group []int
	hits := map[counter]uint64{}
	for i, c := range checks {
		if r := c.rule; r != nil && !r.unlimited && !r.shadow {
			group = append(group, i)
			if !r.blocked {
				k := counter{r.policy, c.key}
				// Saturating: a descriptor's hits may be up to 2^64 - 1.
				hits[k] += min(c.hits, math.MaxUint64-hits[k])
			}
		}
	}
	over := false
	for _, i := range group {
		c := &checks[i]
		if !c.rule.blocked && hits[counter{c.rule.policy, c.key}] > uint64(c.rule.policy.Limit.Capacity()) {
			c.overCapacity, c.cost = true, 0
		}
		over = over || c.rule.blocked || c.overCapacity
	}
	if len(group) == 0 {
		return nil
	}
	if over {
		for _, i := range group {
			c := checks[i]
			if c.rule.blocked || c.overCapacity {
				st, err := s.decide(ctx, t, c)
				if err != nil {
					return fmt.Errorf("descriptors[%d]: %w", i, err)
				}
				sts[i] = st
				continue
			}
			res, err := s.node.Check(ctx, c.rule.policy, c.key, 0)
			if err != nil {
				return fmt.Errorf("descriptors[%d]: %w", i, err)
			}
			// Remaining is the largest cost a check would admit.
			sts[i] = s.answer(ctx, t, c, res, res.Remaining < max(c.cost, 1), false)
		}
		return nil
	}
	items := make([]node.Item, len(group))
	for j, i := range group {
		items[j] = node.Item{Policy: checks[i].rule.policy, Key: checks[i].key, Cost: checks[i].cost}
	}
	res, err := s.node.CheckAll(ctx, items)
	if ie := (*node.ItemError)(nil); errors.As(err, &ie) {
		return fmt.Errorf("descriptors[%d]: %w", group[ie.Index], ie.Err)
	}
	if err != nil {
		return err
	}
	for j, i := range group {
		r := res[j]
		sts[i] = s.answer(ctx, t, checks[i], r, !r.Allowed && r.RetryAfter > 0, r.Allowed)
	}
	return nil
}

// status is the answer for a descriptor of rule r: OVER_LIMIT when over,
// unless r is in shadow mode.
func (s *Service) status(r *rule, over bool, remaining uint32, reset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	code := rlsv3.RateLimitResponse_OK
	if over && !r.shadow {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               code,
		CurrentLimit:       r.limit.proto(),
		LimitRemaining:     remaining,
		DurationUntilReset: durationpb.New(reset),
	}
}
