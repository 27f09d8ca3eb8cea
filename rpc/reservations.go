package rpc

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// This file serves reservations (node.Reserve, node.Settle): the API's
// Reserve and Settle. Their errors are plain domain errors;
// errorInterceptor gives them their codes.

// Reserve implements QuotaService.Reserve.
func (s *service) Reserve(ctx context.Context, req *connect.Request[quotadv1.ReserveRequest]) (*connect.Response[quotadv1.ReserveResponse], error) {
	res, err := s.reserve(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// reserve resolves the request's policy as check does and asks the node
// for the decision and a reservation.
func (s *service) reserve(ctx context.Context, req *quotadv1.ReserveRequest) (*quotadv1.ReserveResponse, error) {
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
	var lifetime time.Duration
	if lt := req.GetLifetime(); lt != nil {
		if lifetime, err = reservationLifetime(lt); err != nil {
			return nil, err
		}
	}
	res, rv, err := s.node.Reserve(ctx, p, req.GetKey(), cost, lifetime)
	if err != nil {
		return nil, err
	}
	out := &quotadv1.ReserveResponse{Decision: checkResponse(res)}
	if rv.ID != "" {
		out.ReservationId, out.ExpiresAfter = rv.ID, durationpb.New(rv.Lifetime)
	}
	return out, nil
}

// reservationLifetime reads a request's lifetime: whole milliseconds from
// 1ms to algorithms.MaxReservationLifetime.
func reservationLifetime(d *durationpb.Duration) (time.Duration, error) {
	if err := d.CheckValid(); err != nil {
		return 0, fmt.Errorf("lifetime: %w: %v", node.ErrInvalidReservation, err)
	}
	lt := d.AsDuration()
	if lt%time.Millisecond != 0 || lt < time.Millisecond || lt > algorithms.MaxReservationLifetime {
		return 0, fmt.Errorf("lifetime: %w: %s (want whole milliseconds from 1ms to %s, e.g. \"600s\")", node.ErrInvalidReservation, lt, algorithms.MaxReservationLifetime)
	}
	return lt, nil
}

// Settle implements QuotaService.Settle.
func (s *service) Settle(ctx context.Context, req *connect.Request[quotadv1.SettleRequest]) (*connect.Response[quotadv1.SettleResponse], error) {
	res, err := s.settle(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// settle resolves the request's policy as check does and settles the
// reservation through the node.
func (s *service) settle(ctx context.Context, req *quotadv1.SettleRequest) (*quotadv1.SettleResponse, error) {
	if err := node.ValidateKey(req.GetKey()); err != nil {
		return nil, err
	}
	p, err := s.policies.resolveLimit(s.node.PolicySet(), req.GetPolicy(), req.GetLimit())
	if err != nil {
		return nil, err
	}
	st, err := s.node.Settle(ctx, p, req.GetKey(), req.GetReservationId(), req.GetActual())
	if err != nil {
		return nil, err
	}
	return &quotadv1.SettleResponse{
		Outcome:        settleOutcomeToProto(st.Outcome),
		ActualRecorded: st.Recorded,
		Refunded:       st.Refunded,
		Charged:        st.Charged,
		After:          checkResponse(node.Result{Decision: st.After, Source: node.SourceStore}),
	}, nil
}

func settleOutcomeToProto(o algorithms.SettleOutcome) quotadv1.SettleOutcome {
	switch o {
	case algorithms.Settled:
		return quotadv1.SettleOutcome_SETTLE_OUTCOME_SETTLED
	case algorithms.SettledBefore:
		return quotadv1.SettleOutcome_SETTLE_OUTCOME_SETTLED_BEFORE
	}
	return quotadv1.SettleOutcome_SETTLE_OUTCOME_NO_RESERVATION
}
