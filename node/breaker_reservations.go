package node

import (
	"context"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// The reservation calls of a remote store behind the breaker, as Acquire
// and Release: refused at once while it is open, counted, and their
// outcome recorded. A store that keeps none answers ErrNoReservations
// without a call.

func (s breakerStore) Reserve(ctx context.Context, base string, l algorithms.Limit, cost int64, id string, lifetime time.Duration) (algorithms.Decision, error) {
	rs, ok := s.Store.(ReservationStore)
	if !ok {
		return algorithms.Decision{}, ErrNoReservations
	}
	if err := s.b.allow(); err != nil {
		return algorithms.Decision{}, err
	}
	s.b.calls.Add(1)
	d, err := rs.Reserve(ctx, base, l, cost, id, lifetime)
	s.b.record(ctx, err)
	return d, err
}

func (s breakerStore) Settle(ctx context.Context, base string, l algorithms.Limit, id string, actual int64) (algorithms.Settlement, error) {
	rs, ok := s.Store.(ReservationStore)
	if !ok {
		return algorithms.Settlement{}, ErrNoReservations
	}
	if err := s.b.allow(); err != nil {
		return algorithms.Settlement{}, err
	}
	s.b.calls.Add(1)
	out, err := rs.Settle(ctx, base, l, id, actual)
	s.b.record(ctx, err)
	return out, err
}
