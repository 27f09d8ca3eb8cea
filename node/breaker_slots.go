package node

import (
	"context"

	"github.com/quotad/quotad/algorithms"
)

// The slot calls of a remote store behind the breaker, as Acquire and
// Release: refused at once while it is open, counted, and their outcome
// recorded. A slot that is not held is an answer, not a failure.

func (s breakerStore) AcquireSlot(ctx context.Context, base string, l algorithms.Limit, id string, cost int64) (algorithms.Decision, error) {
	if err := s.b.allow(); err != nil {
		return algorithms.Decision{}, err
	}
	s.b.calls.Add(1)
	d, err := s.Store.AcquireSlot(ctx, base, l, id, cost)
	s.b.record(ctx, err)
	return d, err
}

func (s breakerStore) RenewSlot(ctx context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	return s.slotCall(ctx, base, l, id, s.Store.RenewSlot)
}

func (s breakerStore) ReleaseSlot(ctx context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	return s.slotCall(ctx, base, l, id, s.Store.ReleaseSlot)
}

func (s breakerStore) slotCall(ctx context.Context, base string, l algorithms.Limit, id string,
	call func(context.Context, string, algorithms.Limit, string) (algorithms.Decision, bool, error)) (algorithms.Decision, bool, error) {
	if err := s.b.allow(); err != nil {
		return algorithms.Decision{}, false, err
	}
	s.b.calls.Add(1)
	d, held, err := call(ctx, base, l, id)
	s.b.record(ctx, err)
	return d, held, err
}
