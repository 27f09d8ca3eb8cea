package memory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// Reservations (node.ReservationStore) in memory: each record is the Go
// model algorithms.Reservation, kept in its limit's shard until its
// lifetime ends, and counted against MaxKeys as a state is.

type reservationKey struct{ base, id string }

type heldReservation struct {
	algorithms.Reservation
	expiresAtMs int64
}

// errReservationIDInUse is a Reserve with the id of a reservation still
// held: the node's ids are random, so it never happens by chance.
var errReservationIDInUse = errors.New("reservation id in use")

// Reserve implements node.ReservationStore.
func (s *Store) Reserve(_ context.Context, base string, l algorithms.Limit, cost int64, id string, lifetime time.Duration) (algorithms.Decision, error) {
	nowMs := s.now().UnixMilli()
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	rk := reservationKey{base, id}
	if r, held := sh.reservations[rk]; held && r.expiresAtMs > nowMs {
		return algorithms.Decision{}, fmt.Errorf("memory reserve: %w", errReservationIDInUse)
	}
	if _, held := sh.reservations[rk]; !held && !s.reserve() {
		return algorithms.Decision{}, fmt.Errorf("%w: it holds %d keys, its maximum; retry when some expire", node.ErrStoreFull, s.maxKeys)
	}
	d, g, err := s.acquireLocked(sh, node.AcquireRequest{Base: base, Limit: l, Cost: cost, Want: cost}, nowMs)
	if err != nil || !d.Allowed || g.Units == 0 {
		s.dropReservation(sh, rk)
		return d, err
	}
	sh.reservations[rk] = &heldReservation{
		Reservation: algorithms.Reservation{Estimate: cost, Grant: g},
		expiresAtMs: nowMs + lifetime.Milliseconds(),
	}
	return d, nil
}

// dropReservation forgets rk's record, if any, and the room it took.
func (s *Store) dropReservation(sh *stateShard, rk reservationKey) {
	delete(sh.reservations, rk)
	s.keys.Add(-1)
}

// Settle implements node.ReservationStore. A record past its lifetime is
// no reservation, as its Redis key would have expired; a settled one is
// kept until then, so that a retried settle finds it.
func (s *Store) Settle(_ context.Context, base string, l algorithms.Limit, id string, actual int64) (algorithms.Settlement, error) {
	nowMs := s.now().UnixMilli()
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := stateKey{base, l.Algorithm}
	e, held := sh.states[k]
	if !held || e.expiresAtMs <= nowMs {
		e = &entry{state: algorithms.NewState(l.Algorithm)}
	}
	if e.state == nil {
		return algorithms.Settlement{}, fmt.Errorf("memory settle: %w %s has no State", algorithms.ErrUnknownAlgorithm, l.Algorithm)
	}
	r := sh.reservations[reservationKey{base, id}]
	if r == nil || r.expiresAtMs <= nowMs {
		return algorithms.Settlement{After: e.state.Check(l, nowMs, 0)}, nil
	}
	out := r.Settle(e.state, l, nowMs, actual)
	switch reset := out.After.ResetAfter; {
	case reset > 0 && !held:
		if !s.reserve() {
			// The settlement stands in the record; only the state's
			// change is lost, as a lost Redis write would be.
			return out, fmt.Errorf("%w: it holds %d keys, its maximum; the settlement's charge was not kept", node.ErrStoreFull, s.maxKeys)
		}
		e.expiresAtMs = nowMs + reset.Milliseconds()
		sh.states[k] = e
	case reset > 0:
		e.expiresAtMs = nowMs + reset.Milliseconds()
		sh.states[k] = e
	}
	return out, nil
}
