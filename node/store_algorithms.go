package node

import (
	"fmt"

	"github.com/quotad/quotad/algorithms"
)

// This file is what the node does with a store that keeps only some
// algorithms (AlgorithmStore): it refuses the others before they reach the
// store, at configuration where it can, else per call.

// ErrAlgorithmNotKept refuses a policy or inline limit of an algorithm the node's
// store does not keep (the memcached store keeps fixed windows only). It
// is an input error: choose another algorithm, or another store.
var ErrAlgorithmNotKept = algorithms.NewInputError("algorithm not kept by this store")

// AlgorithmStore is a store that keeps the states of some algorithms only.
// New and SetPolicies refuse a configured policy of another algorithm;
// a check, batch, lease, reservation or slot call of an inline limit of
// one fails with the store's error before reaching it.
type AlgorithmStore interface {
	Store
	// Keeps returns nil when the store keeps a's states, else an error
	// wrapping ErrAlgorithmNotKept that says which algorithms it keeps.
	// It never blocks.
	Keeps(a algorithms.Algorithm) error
}

// keeps reports whether keeper, the node's store if it keeps some
// algorithms only (nil if it keeps every one), keeps p's algorithm: nil,
// or the store's error naming the policy.
func keeps(keeper AlgorithmStore, p Policy) error {
	if keeper == nil {
		return nil
	}
	if err := keeper.Keeps(p.Limit.Algorithm); err != nil {
		return fmt.Errorf("policy %s: %w", p.Name, err)
	}
	return nil
}

// keepsAll is keeps for every policy of ps, naming the first refused by
// its index, as Config.Validate names policies.
func keepsAll(keeper AlgorithmStore, ps []Policy) error {
	for i, p := range ps {
		if err := keeps(keeper, p); err != nil {
			return fmt.Errorf("policies[%d]: %w", i, err)
		}
	}
	return nil
}

// validatedFor is p.validated, and then keeps: what every call that takes
// a policy from a caller checks first.
func (n *Node) validatedFor(p Policy) (Policy, error) {
	p, err := p.validated()
	if err != nil {
		return Policy{}, err
	}
	if err := keeps(n.keeper, p); err != nil {
		return Policy{}, err
	}
	return p, nil
}
