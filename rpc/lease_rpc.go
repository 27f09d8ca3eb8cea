package rpc

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// This file serves client-side leases (node.GrantLease, node.ReturnLease):
// the API's AcquireLease and ReturnLease. Their errors are plain domain
// errors; errorInterceptor gives them their codes.

// AcquireLease implements QuotaService.AcquireLease.
func (s *service) AcquireLease(ctx context.Context, req *connect.Request[quotadv1.AcquireLeaseRequest]) (*connect.Response[quotadv1.AcquireLeaseResponse], error) {
	res, err := s.acquireLease(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// acquireLease resolves the request's policy as check does and asks the
// node for the decision and a grant.
func (s *service) acquireLease(ctx context.Context, req *quotadv1.AcquireLeaseRequest) (*quotadv1.AcquireLeaseResponse, error) {
	// As in check: a malformed key is InvalidArgument even when the policy
	// is unknown too.
	if err := node.ValidateKey(req.GetKey()); err != nil {
		return nil, err
	}
	p, err := s.policies.resolveLimit(s.node.PolicySet(), req.GetPolicy(), req.GetLimit())
	if err != nil {
		return nil, err
	}
	cost := int64(1)
	if req.Cost != nil {
		cost = *req.Cost
	}
	if s.noClientLeases {
		res, err := s.node.Check(ctx, p, req.GetKey(), cost)
		if err != nil {
			return nil, err
		}
		return &quotadv1.AcquireLeaseResponse{Decision: withSlot(checkResponse(res), res, p)}, nil
	}
	previous := node.LeaseReturn{ID: req.GetPreviousLeaseId(), Units: req.GetPreviousUnits(), Kept: req.GetPreviousKept()}
	res, g, err := s.node.GrantLease(ctx, p, req.GetKey(), cost, req.GetWant(), previous)
	if err != nil {
		return nil, err
	}
	out := &quotadv1.AcquireLeaseResponse{Decision: checkResponse(res)}
	if g.Units > 0 {
		out.Units, out.UseWithin, out.LeaseId = g.Units, durationpb.New(g.UseWithin), g.ID
	}
	return out, nil
}

// ReturnLease implements QuotaService.ReturnLease.
func (s *service) ReturnLease(ctx context.Context, req *connect.Request[quotadv1.ReturnLeaseRequest]) (*connect.Response[quotadv1.ReturnLeaseResponse], error) {
	res, err := s.returnLease(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// returnLease gives a client lease's unspent units back through the node.
func (s *service) returnLease(ctx context.Context, req *quotadv1.ReturnLeaseRequest) (*quotadv1.ReturnLeaseResponse, error) {
	returned, err := s.node.ReturnLease(ctx, req.GetLeaseId(), req.GetUnits())
	if err != nil {
		return nil, err
	}
	return &quotadv1.ReturnLeaseResponse{Returned: returned}, nil
}
