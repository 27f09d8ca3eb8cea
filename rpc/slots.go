package rpc

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// RenewSlot implements QuotaService.RenewSlot.
func (s *service) RenewSlot(ctx context.Context, req *connect.Request[quotadv1.RenewSlotRequest]) (*connect.Response[quotadv1.RenewSlotResponse], error) {
	res, err := s.renewSlot(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// renewSlot makes a slot live another period. Errors are node.RenewSlot's,
// and the policy resolution's of Check.
func (s *service) renewSlot(ctx context.Context, m *quotadv1.RenewSlotRequest) (*quotadv1.RenewSlotResponse, error) {
	p, err := s.slotPolicy(m.GetPolicy(), m.GetKey(), m.GetLimit())
	if err != nil {
		return nil, err
	}
	res, err := s.node.RenewSlot(ctx, p, m.GetKey(), m.GetSlotId())
	if err != nil {
		return nil, err
	}
	return &quotadv1.RenewSlotResponse{
		Limit:        res.Limit,
		Remaining:    res.Remaining,
		ExpiresAfter: durationpb.New(p.Limit.Period),
	}, nil
}

// ReleaseSlot implements QuotaService.ReleaseSlot.
func (s *service) ReleaseSlot(ctx context.Context, req *connect.Request[quotadv1.ReleaseSlotRequest]) (*connect.Response[quotadv1.ReleaseSlotResponse], error) {
	res, err := s.releaseSlot(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// releaseSlot frees a slot. Errors are node.ReleaseSlot's, and the policy
// resolution's of Check.
func (s *service) releaseSlot(ctx context.Context, m *quotadv1.ReleaseSlotRequest) (*quotadv1.ReleaseSlotResponse, error) {
	p, err := s.slotPolicy(m.GetPolicy(), m.GetKey(), m.GetLimit())
	if err != nil {
		return nil, err
	}
	res, err := s.node.ReleaseSlot(ctx, p, m.GetKey(), m.GetSlotId())
	if err != nil {
		return nil, err
	}
	return &quotadv1.ReleaseSlotResponse{Limit: res.Limit, Remaining: res.Remaining}, nil
}

// slotPolicy resolves the policy of a renew or release as Check resolves
// its own, the key first so that a malformed request is InvalidArgument
// whatever its policy.
func (s *service) slotPolicy(name, key string, limit *quotadv1.Limit) (node.Policy, error) {
	if err := node.ValidateKey(key); err != nil {
		return node.Policy{}, err
	}
	return s.policies.resolveLimit(s.node.PolicySet(), name, limit)
}
