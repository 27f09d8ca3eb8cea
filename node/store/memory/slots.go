package memory

import (
	"context"
	"fmt"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// Concurrency slots in the memory store live in the same map as the rate
// algorithms' states, under the key's base and algorithms.Concurrency,
// with their entry's expiry at the newest slot's (the analogue of the Redis
// TTL): sweeps, Len and Reset treat them like any other state.

// AcquireSlot implements node.SlotStore. It never blocks on I/O. Its only error
// is node.ErrStoreFull, for a slot that would add a state to a full store (as
// Acquire's); a check that takes no slot (cost 0, a denial) never fails.
func (s *Store) AcquireSlot(_ context.Context, base string, l algorithms.Limit, id string, cost int64) (algorithms.Decision, error) {
	nowMs := s.now().UnixMilli()
	k := stateKey{base, algorithms.Concurrency}
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, held := sh.states[k]
	if !held || e.expiresAtMs <= nowMs || e.slots == nil {
		// A fresh state: decided on a copy, so that a refusal below leaves
		// nothing behind. An expired entry still in the map is counted
		// until the sweep or this replacement.
		e = &entry{slots: &algorithms.ConcurrencyState{}}
	}
	d := e.slots.Acquire(l, nowMs, cost, id)
	if d.Allowed && cost > 0 {
		if !held && !s.reserve() {
			return algorithms.Decision{}, fmt.Errorf("%w: it holds %d keys, its maximum; retry when some expire", node.ErrStoreFull, s.maxKeys)
		}
		e.expiresAtMs = nowMs + d.ResetAfter.Milliseconds()
		sh.states[k] = e
	}
	return d, nil
}

// RenewSlot implements node.SlotStore. It never fails and never blocks on I/O.
func (s *Store) RenewSlot(_ context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	return s.slotCall(base, l, id, true)
}

// ReleaseSlot implements node.SlotStore. It never fails and never blocks on I/O.
func (s *Store) ReleaseSlot(_ context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	return s.slotCall(base, l, id, false)
}

// slotCall renews (renew) or releases the slot id stored under base.
func (s *Store) slotCall(base string, l algorithms.Limit, id string, renew bool) (algorithms.Decision, bool, error) {
	nowMs := s.now().UnixMilli()
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.states[stateKey{base, algorithms.Concurrency}]
	if e == nil || e.expiresAtMs <= nowMs || e.slots == nil {
		// Every slot has expired (or none was taken): as a fresh state.
		var fresh algorithms.ConcurrencyState
		d, _ := fresh.Release(l, nowMs, id)
		return d, false, nil
	}
	if !renew {
		// Like ZREM, a release keeps the entry's expiry.
		d, held := e.slots.Release(l, nowMs, id)
		return d, held, nil
	}
	d, held := e.slots.Renew(l, nowMs, id)
	if held {
		e.expiresAtMs = nowMs + d.ResetAfter.Milliseconds()
	}
	return d, held, nil
}
