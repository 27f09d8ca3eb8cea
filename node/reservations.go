package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// Reservations: a check of an estimated cost whose cost is made exact
// once the work is done (docs/algorithms.md, "Reservations"). Reserve
// checks the estimate at the store and, when it is admitted, the store
// records the reservation under an id; Settle gives that id the actual
// cost, once, at any node of the cluster: the store refunds what was not
// used, or charges what was used beyond the estimate, into debt if need
// be. A reservation not settled in its lifetime stays charged its
// estimate. Both go to the store every time: neither is answered from a
// lease, so every node settles every reservation.

// ReservationStore is a store that keeps reservations: both of this
// package's stores do. A Store that does not (a test's) makes Reserve and
// Settle fail with ErrNoReservations.
type ReservationStore interface {
	// Reserve is Acquire of cost units of l under base, with no lease,
	// that also records, when it admits a positive cost, the reservation
	// id for lifetime. Its errors are Acquire's.
	Reserve(ctx context.Context, base string, l algorithms.Limit, cost int64, id string, lifetime time.Duration) (algorithms.Decision, error)
	// Settle settles the reservation id of l under base with actual
	// (algorithms.Reservation.Settle), exactly once: settling again, or an
	// id it does not hold, changes nothing. actual must pass
	// l.ValidateCharge. An error means nothing is known of the outcome;
	// settling again is safe.
	Settle(ctx context.Context, base string, l algorithms.Limit, id string, actual int64) (algorithms.Settlement, error)
}

// Errors of reservations.
var (
	// ErrNoReservations: the node's store keeps no reservations.
	ErrNoReservations = errors.New("this store keeps no reservations")
	// ErrInvalidReservation: an empty or too long reservation id, or a
	// lifetime out of range.
	ErrInvalidReservation = algorithms.NewInputError("invalid reservation")
	// ErrConcurrencyReservation: a concurrency limit holds slots, taken
	// only while one is free; it has no cost to settle.
	ErrConcurrencyReservation = algorithms.NewInputError("a concurrency limit cannot be reserved; take a slot with Check")
)

// MaxReservationIDLen is the longest reservation id Settle accepts; the
// ids Reserve makes are 26 bytes.
const MaxReservationIDLen = 64

// DefaultReservationLifetime is a reservation's lifetime when Reserve is
// given none.
const DefaultReservationLifetime = 10 * time.Minute

// Reservation is what Reserve recorded: an ID to settle, for Lifetime
// from before the Reserve call. The zero value is no reservation (a
// denial, a cost of 0, or an admission the failure mode made without the
// store).
type Reservation struct {
	ID       string
	Lifetime time.Duration
}

// Reserve decides whether key may spend estimate units of policy p now, as
// Check does, and, when it may (estimate > 0), reserves them under a new
// id for lifetime (0: DefaultReservationLifetime; at most
// algorithms.MaxReservationLifetime), to be settled with the actual cost.
// A remembered denial answers as for Check, with no store call. A store
// failure is not an error: the policy's failure mode decides, and no
// reservation is made. Its errors are Check's, plus
// ErrInvalidReservation, ErrConcurrencyReservation and ErrNoReservations.
func (n *Node) Reserve(ctx context.Context, p Policy, key string, estimate int64, lifetime time.Duration) (Result, Reservation, error) {
	p, err := n.validatedFor(p)
	if err != nil {
		return Result{}, Reservation{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Result{}, Reservation{}, err
	}
	if p.Limit.Algorithm == algorithms.Concurrency {
		return Result{}, Reservation{}, fmt.Errorf("policy %s: %w", p.Name, ErrConcurrencyReservation)
	}
	if err := p.Limit.ValidateCost(estimate); err != nil {
		return Result{}, Reservation{}, err
	}
	if lifetime == 0 {
		lifetime = DefaultReservationLifetime
	}
	if lifetime < time.Millisecond || lifetime > algorithms.MaxReservationLifetime {
		return Result{}, Reservation{}, fmt.Errorf("lifetime: %w: %s (want 1ms to %s)", ErrInvalidReservation, lifetime, algorithms.MaxReservationLifetime)
	}
	rs, ok := n.store.(ReservationStore)
	if !ok {
		return Result{}, Reservation{}, ErrNoReservations
	}
	k := leaseKey{p.Name, key}
	start := n.clock()
	if d, ok := n.local.denied(k, p.Limit, estimate, start); ok {
		n.stats.deniedCacheHits.Add(1)
		res := Result{Decision: d, Source: SourceDeniedCache}
		n.count(p.Name, key, res)
		return res, Reservation{}, nil
	}
	id := rand.Text()
	d, err := rs.Reserve(context.WithoutCancel(ctx), n.keyBase(p, key), p.Limit, estimate, id, lifetime)
	if err != nil {
		if errors.Is(err, ErrStoreFull) || errors.Is(err, ErrNoReservations) {
			return Result{}, Reservation{}, err
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return Result{}, Reservation{}, fmt.Errorf("reserve %s: %w", p.Name, ctxErr)
		}
		res, err := n.storeFailed(p, err)
		if err == nil {
			n.count(p.Name, key, res)
		}
		return res, Reservation{}, err
	}
	res := Result{Decision: d, Source: SourceStore}
	n.count(p.Name, key, res)
	if !d.Allowed {
		n.local.remember(k, nil, p.Limit, max(estimate, 1), d, start)
		return res, Reservation{}, nil
	}
	if estimate == 0 {
		return res, Reservation{}, nil
	}
	return res, Reservation{ID: id, Lifetime: lifetime}, nil
}

// Settle settles the reservation id of key under policy p (made by Reserve
// at any node sharing the store) with actual, the units the work used:
// below the estimate the difference goes back as a lease's unused units
// do; above it the difference is charged and always counts, into debt
// when it does not fit, so that later checks are denied until the
// algorithm's refill or window pays it back. Exactly once: settling a
// settled reservation (a retry after a lost reply) changes nothing and
// reports algorithms.SettledBefore with the actual it was settled with; an
// id the store does not hold (never reserved, denied, or past its
// lifetime) reports algorithms.NoReservation and changes nothing.
//
// Invalid input (policy, key, id, actual above l.MaxCharge, a concurrency
// policy) is an error wrapping this package's or package algorithms'
// sentinels. A store failure wraps ErrStore (no failure mode applies: the
// caller may settle again, safely), or ErrOverloaded.
func (n *Node) Settle(ctx context.Context, p Policy, key, id string, actual int64) (algorithms.Settlement, error) {
	p, err := n.validatedFor(p)
	if err != nil {
		return algorithms.Settlement{}, err
	}
	if err := ValidateKey(key); err != nil {
		return algorithms.Settlement{}, err
	}
	if id == "" || len(id) > MaxReservationIDLen {
		return algorithms.Settlement{}, fmt.Errorf("reservation_id: %w: %d bytes (want 1 to %d)", ErrInvalidReservation, len(id), MaxReservationIDLen)
	}
	if p.Limit.Algorithm == algorithms.Concurrency {
		return algorithms.Settlement{}, fmt.Errorf("policy %s: %w", p.Name, ErrConcurrencyReservation)
	}
	if most := p.Limit.MaxCharge(); actual < 0 || actual > most {
		return algorithms.Settlement{}, fmt.Errorf("actual: %w: %d (want 0 to %d, the most a key of this limit can owe)", algorithms.ErrInvalidCost, actual, most)
	}
	rs, ok := n.store.(ReservationStore)
	if !ok {
		return algorithms.Settlement{}, ErrNoReservations
	}
	k := leaseKey{p.Name, key}
	start := n.clock()
	s, err := rs.Settle(context.WithoutCancel(ctx), n.keyBase(p, key), p.Limit, id, actual)
	if err != nil {
		if errors.Is(err, ErrNoReservations) {
			return algorithms.Settlement{}, err
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return algorithms.Settlement{}, fmt.Errorf("settle %s: %w", p.Name, ctxErr)
		}
		if errors.Is(err, ErrOverloaded) {
			return algorithms.Settlement{}, fmt.Errorf("settle %s: %w", p.Name, err)
		}
		return algorithms.Settlement{}, fmt.Errorf("settle %s: %w: %v", p.Name, ErrStore, err)
	}
	switch {
	case s.Refunded > 0:
		// Units went back: a remembered denial of the key may no longer
		// hold.
		n.local.returned(k)
	case !s.After.Allowed:
		// A charge into debt, or a key already spent: the next checks are
		// denied until After's wait, here and at every member.
		n.local.remember(k, nil, p.Limit, 1, s.After, start)
	}
	return s, nil
}
