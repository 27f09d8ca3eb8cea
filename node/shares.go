package node

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Shares: the members of a cluster that divide one limit among their own
// clients (Envoy's rate limit quota service, package rpc/rlqs) publish
// what their clients ask for, round by round, and read what every member
// published, so that each computes the same division. The store keeps the
// published vectors; they are opaque to it.

// ShareStore is a store that keeps the members' published demand: both of
// this package's stores do. A Store that does not (a test's) makes
// ShareDemand fail with ErrNoShares.
type ShareStore interface {
	// ExchangeShares records vector as member's for round under base, in
	// one atomic step that also returns, by member, every vector recorded
	// for round-1 (member's own included) that has not expired. A record
	// lives ttl past the last write to base. It may block on the network
	// until ctx is done.
	ExchangeShares(ctx context.Context, base, member string, round int64, vector string, ttl time.Duration) (map[string]string, error)
}

// ErrNoShares is the error of a store that keeps no published demand.
var ErrNoShares = errors.New("this store keeps no shares")

// ShareDemand records vector as member's demand for round under policy p
// and key, and returns every member's vector of round-1, keyed by member:
// what all members published a round earlier, which is the same set for
// every member that asks during round. The record lives ttl (at least one
// millisecond). member and vector are opaque; member must not be empty.
// Errors: invalid input, ErrNoShares, or the store's failure wrapping
// ErrStore (no failure mode applies: the caller decides what a round
// without the others' demand means).
func (n *Node) ShareDemand(ctx context.Context, p Policy, key, member string, round int64, vector string, ttl time.Duration) (map[string]string, error) {
	p, err := p.validated()
	if err != nil {
		return nil, err
	}
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	if member == "" {
		return nil, fmt.Errorf("share demand: %w: empty member", ErrInvalidInput)
	}
	if ttl < time.Millisecond {
		return nil, fmt.Errorf("share demand: %w: ttl %s (want 1ms or more)", ErrInvalidInput, ttl)
	}
	ss, ok := n.store.(ShareStore)
	if !ok {
		return nil, ErrNoShares
	}
	out, err := ss.ExchangeShares(ctx, n.keyBase(p, key)+":shares", member, round, vector, ttl)
	if err != nil {
		if errors.Is(err, ErrNoShares) {
			return nil, err
		}
		return nil, fmt.Errorf("share demand %s: %w: %v", p.Name, ErrStore, err)
	}
	return out, nil
}
