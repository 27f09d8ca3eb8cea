package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/quotad/quotad/algorithms"
)

// Concurrency limits. A check of a concurrency policy takes a slot under a
// random id the node chooses and returns the id (Result.Slot); the holder
// renews it (RenewSlot) while it works and releases it (ReleaseSlot) when
// done. A slot whose holder dies expires a period after its last renew and
// is free again. The rules are algorithms.ConcurrencyState's.
//
// Slots always go to the store: leases and the denied cache do not apply.
// A lease would be slots taken ahead for checks that never name them, and a
// slot may be released at any moment, so a remembered denial could deny a
// slot the store would grant.

// Errors of the slot operations; each is wrapped with the field or
// operation.
var (
	// ErrSlotNotHeld: a renew or release named a slot that the store does
	// not hold: never taken, already released, or expired (its holder did
	// not renew it within a period). Nothing was changed.
	ErrSlotNotHeld = errors.New("slot not held")
	// ErrInvalidSlot: the slot id is empty or longer than
	// algorithms.MaxSlotIDLen.
	ErrInvalidSlot = algorithms.NewInputError("invalid slot id")
	// ErrNotConcurrency: a renew or release named a policy whose algorithm
	// is not concurrency; only concurrency limits hold slots.
	ErrNotConcurrency = algorithms.NewInputError("not a concurrency limit")
)

// SlotStore holds concurrency slots; every Store is one. Methods are safe
// for concurrent use, may block on the network until ctx is done, and an
// error means nothing is known of the outcome. l must be a valid
// concurrency limit and base a key base (see Store).
type SlotStore interface {
	// AcquireSlot is algorithms.ConcurrencyState.Acquire on the state
	// stored under base: cost 1 takes the slot named id if one is free,
	// cost 0 reports whether one is.
	AcquireSlot(ctx context.Context, base string, l algorithms.Limit, id string, cost int64) (algorithms.Decision, error)
	// RenewSlot is algorithms.ConcurrencyState.Renew: it extends the slot
	// named id if it is held, and reports whether it was.
	RenewSlot(ctx context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error)
	// ReleaseSlot is algorithms.ConcurrencyState.Release: it frees the slot
	// named id if it is held, and reports whether it was.
	ReleaseSlot(ctx context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error)
}

// newSlotID returns a fresh slot id: 128 random bits in 26 characters of
// base32. Ids are never reused, so a stale holder's renew or release can
// never touch a slot someone else took meanwhile, and nobody can guess
// another holder's id.
func newSlotID() string { return rand.Text() }

// checkSlot is the check path of a concurrency limit (after validation):
// straight to the store, with a new slot id when cost is 1.
func (n *Node) checkSlot(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	var id string
	if cost > 0 {
		id = newSlotID()
	}
	d, err := n.store.AcquireSlot(ctx, n.keyBase(p, key), p.Limit, id, cost)
	if errors.Is(err, ErrStoreFull) {
		// As in Check: failing open would stop limiting every new key for
		// as long as the memory store is full.
		return Result{}, err
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return Result{}, fmt.Errorf("check %s: %w", p.Name, ctxErr)
		}
		// Failing open admits without a slot: there is nothing to renew or
		// release. A slot the store took before the reply was lost stays
		// held until it expires.
		return n.storeFailed(p, err)
	}
	res := Result{Decision: d, Source: SourceStore}
	if d.Allowed && cost > 0 {
		res.Slot = id
	}
	return res, nil
}

// RenewSlot extends the slot id that a check of key under the concurrency
// policy p took, to live p's period from now, and returns the limit's
// state after it (Allowed true). Invalid input (policy, key, slot id, a
// policy that is not a concurrency limit) is an error wrapping one of this
// package's or package algorithms' sentinels; a slot that is not held
// (never taken, released, or expired) wraps ErrSlotNotHeld and changes
// nothing; a store failure wraps ErrStore (there is no failure mode to
// take: the holder may retry while the slot lives), or ErrOverloaded when
// the node did not get to the store call in time. It may block on the
// store until ctx is done.
func (n *Node) RenewSlot(ctx context.Context, p Policy, key, id string) (Result, error) {
	return n.slotOp(ctx, "renew", p, key, id, n.store.RenewSlot)
}

// ReleaseSlot frees the slot id that a check of key under the concurrency
// policy p took, and returns the limit's state after it (Allowed true). A
// slot is freed at most once: releasing it again, or after it expired,
// wraps ErrSlotNotHeld and frees nothing. Errors are otherwise as
// RenewSlot's.
func (n *Node) ReleaseSlot(ctx context.Context, p Policy, key, id string) (Result, error) {
	return n.slotOp(ctx, "release", p, key, id, n.store.ReleaseSlot)
}

// slotOp validates a renew or release (op) and runs it with call.
func (n *Node) slotOp(ctx context.Context, op string, p Policy, key, id string,
	call func(context.Context, string, algorithms.Limit, string) (algorithms.Decision, bool, error)) (Result, error) {
	p, err := n.validatedFor(p)
	if err != nil {
		return Result{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Result{}, err
	}
	if err := ValidateSlotID(id); err != nil {
		return Result{}, err
	}
	if p.Limit.Algorithm != algorithms.Concurrency {
		return Result{}, fmt.Errorf("policy: %w: %q is a %s limit; only concurrency limits hold slots", ErrNotConcurrency, p.Name, p.Limit.Algorithm)
	}
	d, held, err := call(ctx, n.keyBase(p, key), p.Limit, id)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return Result{}, fmt.Errorf("%s slot %s: %w", op, p.Name, ctxErr)
		}
		if errors.Is(err, ErrOverloaded) {
			return Result{}, fmt.Errorf("%s slot %s: %w", op, p.Name, err)
		}
		return Result{}, fmt.Errorf("%s slot %s: %w: %v", op, p.Name, ErrStore, err)
	}
	if !held {
		return Result{}, fmt.Errorf("slot_id: %w: %q of policy %q and this key was never taken, was already released, or has expired (a slot lives %s unless renewed)",
			ErrSlotNotHeld, id, p.Name, p.Limit.Period)
	}
	return Result{Decision: d, Source: SourceStore}, nil
}

// ValidateSlotID reports whether id can name a slot: 1 to
// algorithms.MaxSlotIDLen bytes.
func ValidateSlotID(id string) error {
	if id == "" {
		return fmt.Errorf("slot_id: %w: must not be empty", ErrInvalidSlot)
	}
	if len(id) > algorithms.MaxSlotIDLen {
		return fmt.Errorf("slot_id: %w: %d bytes exceeds %d", ErrInvalidSlot, len(id), algorithms.MaxSlotIDLen)
	}
	return nil
}
