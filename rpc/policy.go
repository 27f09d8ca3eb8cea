package rpc

import (
	"fmt"
	"time"

	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// policyResolver decides which policy a check is about: a configured one,
// or an inline limit under a namespace the request names.
type policyResolver struct {
	inlineAllowed bool
	// maxInlinePeriod bounds how long an inline limit's state may live
	// (checkInlineLifetime).
	maxInlinePeriod time.Duration
}

// resolve returns the policy req names among the configured policies set. Without a limit, the policy must be
// configured (NotFound otherwise). With a limit, inline limits must be
// allowed (PermissionDenied otherwise) and the name must not be a configured
// policy's: letting a request bring its own limit under a configured name
// would let any client replace that limit with a bigger one.
//
// The policy name is validated first, so that a malformed name is an
// InvalidArgument, never a NotFound.
func (r policyResolver) resolve(set *node.PolicySet, req *quotadv1.CheckRequest) (node.Policy, error) {
	return r.resolveLimit(set, req.GetPolicy(), req.GetLimit())
}

// resolveLimit is resolve for the policy name and inline limit (nil for
// none) of any request that names a limit, among the configured policies
// set.
func (r policyResolver) resolveLimit(set *node.PolicySet, name string, limit *quotadv1.Limit) (node.Policy, error) {
	if err := node.ValidatePolicyName(name); err != nil {
		return node.Policy{}, err
	}
	configured, isConfigured := set.Policy(name)
	if limit == nil {
		if !isConfigured {
			return node.Policy{}, r.unknown(name)
		}
		return configured, nil
	}
	if !r.inlineAllowed {
		return node.Policy{}, fmt.Errorf("limit: %w", errInlineDisabled)
	}
	if isConfigured {
		return node.Policy{}, fmt.Errorf("limit: policy %q %w", name, errPolicyConfigured)
	}
	l, mode, err := limitFromProto(limit)
	if err != nil {
		return node.Policy{}, err
	}
	// Validated here, once: node trusts a policy NewPolicy built. The name
	// is valid already, so an error is the limit's.
	p, err := node.NewPolicy(node.Policy{Name: name, Limit: l, OnStoreError: mode})
	if err != nil {
		return node.Policy{}, fmt.Errorf("limit.%w", err)
	}
	if err := checkInlineLifetime(l, r.maxInlinePeriod); err != nil {
		return node.Policy{}, err
	}
	return p, nil
}

// unknown is the NotFound error for a policy that is not configured; it
// tells the caller what would work instead.
func (r policyResolver) unknown(name string) error {
	if r.inlineAllowed {
		return fmt.Errorf("policy: %w %q: not configured on this server; ListPolicies shows the configured ones, or send a limit to use an inline limit", node.ErrUnknownPolicy, name)
	}
	return fmt.Errorf("policy: %w %q: not configured on this server; ListPolicies shows the configured ones", node.ErrUnknownPolicy, name)
}
