package memcache

import (
	"context"
	"fmt"

	"github.com/quotad/quotad/algorithms"
)

// This file is node.SlotStore on memcached: refused, as every algorithm
// but the fixed window (the node refuses concurrency limits before they
// get here; Keeps).

// AcquireSlot implements node.SlotStore: refused.
func (s *Store) AcquireSlot(ctx context.Context, base string, l algorithms.Limit, id string, cost int64) (algorithms.Decision, error) {
	return algorithms.Decision{}, s.noSlots()
}

// RenewSlot implements node.SlotStore: refused.
func (s *Store) RenewSlot(ctx context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	return algorithms.Decision{}, false, s.noSlots()
}

// ReleaseSlot implements node.SlotStore: refused.
func (s *Store) ReleaseSlot(ctx context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	return algorithms.Decision{}, false, s.noSlots()
}

func (s *Store) noSlots() error {
	return fmt.Errorf("memcache slots: %w", s.Keeps(algorithms.Concurrency))
}
