package rpc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotad/quotad/node"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
)

// This file serves Envoy's rate limit service: ShouldRateLimit decides each
// descriptor of a request with the rule its entries match (rls_match.go) and
// the node's Check.

// errUnknownDomain: the request names a domain that is not configured.
var errUnknownDomain = errors.New("unknown domain")

// mountRLS serves Envoy's rate limit service on mux when cfg configures it,
// with the handler options opts, and returns the names of the services it
// mounted (for reflection): none when cfg.Envoy has no domains. cfg is
// defaulted and validated.
func mountRLS(mux *http.ServeMux, n *node.Node, cfg Config, opts ...connect.HandlerOption) (*rlsService, []string, error) {
	if len(cfg.Envoy.Domains) == 0 {
		return nil, nil, nil
	}
	t, err := compileRLS(cfg.Envoy, n.Policy)
	if err != nil {
		return nil, nil, err
	}
	svc := &rlsService{node: n, maxDescriptors: cfg.MaxBatch}
	svc.table.Store(&t)
	mux.Handle(ratelimitv3connect.NewRateLimitServiceHandler(svc, opts...))
	return svc, []string{ratelimitv3connect.RateLimitServiceName}, nil
}

// rlsService implements envoy.service.ratelimit.v3.RateLimitService on a
// node. Its methods return plain domain errors; errorInterceptor gives them
// their codes. It is safe for concurrent use.
type rlsService struct {
	node *node.Node
	// table is the rules; Handler.SetRules swaps in new ones, and each
	// request plans with the one it loaded.
	table atomic.Pointer[rlsTable]
	// maxDescriptors bounds the descriptors of one request, like a batch.
	maxDescriptors int
}

var _ ratelimitv3connect.RateLimitServiceHandler = (*rlsService)(nil)

// rlsCheck is what deciding one descriptor takes. Every descriptor of a
// request is planned before any is decided, so that a malformed descriptor
// fails the request before anything is spent.
type rlsCheck struct {
	// rule applies to the descriptor; nil when none does.
	rule *rlsRule
	// key names the descriptor's counter under rule.policy.
	key string
	// cost is the units to spend, 0 to the policy's capacity.
	cost int64
	// overCapacity means the hits exceed what the policy can ever admit:
	// the descriptor is over its limit, and cost is 0 so that the check
	// reads the counter without spending.
	overCapacity bool
}

// ShouldRateLimit implements RateLimitService.ShouldRateLimit. Every
// descriptor is decided, even after one is over its limit, and spends its
// hits if it fits, as in envoyproxy/ratelimit.
func (s *rlsService) ShouldRateLimit(ctx context.Context, req *connect.Request[rlsv3.RateLimitRequest]) (*connect.Response[rlsv3.RateLimitResponse], error) {
	checks, err := s.plan(req.Msg)
	if err != nil {
		return nil, err
	}
	res := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(checks)),
	}
	for i, c := range checks {
		st, err := s.decide(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("descriptors[%d]: %w", i, err)
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		res.Statuses[i] = st
	}
	return connect.NewResponse(res), nil
}

// plan validates req and plans each of its descriptors.
func (s *rlsService) plan(req *rlsv3.RateLimitRequest) ([]rlsCheck, error) {
	domain := req.GetDomain()
	if domain == "" {
		return nil, fmt.Errorf("domain: %w: must not be empty", errInvalidRequest)
	}
	ds := req.GetDescriptors()
	if n := len(ds); n == 0 || n > s.maxDescriptors {
		return nil, fmt.Errorf("descriptors: %w: %d descriptors; send 1 to %d", errInvalidRequest, n, s.maxDescriptors)
	}
	t := s.table.Load()
	root, ok := t.domains[domain]
	if !ok {
		return nil, fmt.Errorf("domain: %w %q: not configured on this server (configured: %s)", errUnknownDomain, domain, strings.Join(t.names, ", "))
	}
	// A request's hits_addend of 0 means unset, that is 1.
	hits := max(1, uint64(req.GetHitsAddend()))
	checks := make([]rlsCheck, len(ds))
	for i, d := range ds {
		c, err := planDescriptor(root, domain, d, hits)
		if err != nil {
			return nil, fmt.Errorf("descriptors[%d].%w", i, err)
		}
		checks[i] = c
	}
	return checks, nil
}

// planDescriptor validates d and plans its check. requestHits is the
// request's hits_addend, already defaulted. Errors start with the field
// name, relative to the descriptor.
func planDescriptor(root *rlsLevel, domain string, d *rlscommonv3.RateLimitDescriptor, requestHits uint64) (rlsCheck, error) {
	if d.GetLimit() != nil {
		return rlsCheck{}, fmt.Errorf("limit: %w: quotad does not take limit overrides; configure the limit in quotad's envoy section", errInvalidRequest)
	}
	if d.GetIsNegativeHits() {
		return rlsCheck{}, fmt.Errorf("is_negative_hits: %w: quotad does not refund hits", errInvalidRequest)
	}
	pes := d.GetEntries()
	if len(pes) == 0 {
		return rlsCheck{}, fmt.Errorf("entries: %w: must not be empty", errInvalidRequest)
	}
	es := make([]rlsEntry, len(pes))
	for j, pe := range pes {
		e := rlsEntry{key: pe.GetKey(), value: pe.GetValue()}
		if e.key == "" {
			return rlsCheck{}, fmt.Errorf("entries[%d].key: %w: must not be empty", j, errInvalidRequest)
		}
		if e.value == "" {
			return rlsCheck{}, fmt.Errorf("entries[%d].value: %w: must not be empty", j, errInvalidRequest)
		}
		es[j] = e
	}
	rule := root.match(es)
	if rule == nil || rule.unlimited {
		return rlsCheck{rule: rule}, nil
	}
	key := rlsKey(domain, es)
	if err := node.ValidateKey(key); err != nil {
		return rlsCheck{}, fmt.Errorf("entries: the domain and entries make the rate limit's %w", err)
	}
	hits := requestHits
	if h := d.GetHitsAddend(); h != nil {
		// Unlike the request's, a descriptor's 0 is a value: check, do not
		// spend.
		hits = h.GetValue()
	}
	// A cost above the capacity can never be admitted: Envoy's protocol
	// calls that over the limit, where quotad's own API calls it invalid.
	if capacity := rule.policy.Limit.Capacity(); hits > uint64(capacity) {
		return rlsCheck{rule: rule, key: key, overCapacity: true}, nil
	}
	return rlsCheck{rule: rule, key: key, cost: int64(hits)}, nil
}

// decide checks one planned descriptor with the node.
func (s *rlsService) decide(ctx context.Context, c rlsCheck) (*rlsv3.RateLimitResponse_DescriptorStatus, error) {
	switch {
	case c.rule == nil:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}, nil
	case c.rule.unlimited:
		// As envoyproxy/ratelimit answers for unlimited rules.
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}, nil
	}
	p := c.rule.policy
	res, err := s.node.Check(ctx, p, c.key, c.cost)
	if err != nil {
		return nil, err
	}
	code := rlsv3.RateLimitResponse_OK
	if (!res.Allowed || c.overCapacity) && !c.rule.shadow {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:         code,
		CurrentLimit: rateLimitToProto(p),
		// Remaining is at most the capacity, which compileRLS bounded to
		// 32 bits.
		LimitRemaining:     uint32(res.Remaining),
		DurationUntilReset: durationpb.New(res.ResetAfter),
	}, nil
}

// rateLimitToProto describes p's limit the way Envoy does: requests per unit
// of time, named after the policy. The rate is the policy's limit per
// period (a bucket's burst may hold more). The period is given in the
// longest of Envoy's units that divides it, times unit_multiplier when that
// is more than 1 (30s is 1 SECOND × 30; 1h is 1 HOUR); a period that is not
// a whole number of seconds has unit UNKNOWN. compileRLS bounded the limit
// to 32 bits.
func rateLimitToProto(p node.Policy) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: p.Name, RequestsPerUnit: uint32(p.Limit.Limit)}
	rl.Unit, rl.UnitMultiplier = unitToProto(p.Limit.Period)
	return rl
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
