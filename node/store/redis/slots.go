package redis

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
)

// This file is the Redis store's concurrency slots (node.SlotStore).

// slotScripts are the concurrency scripts, loaded with the others.
type slotScripts struct {
	acquire, renew, release *goredis.Script
}

func newSlotScripts() slotScripts {
	return slotScripts{
		acquire: goredis.NewScript(algorithms.AcquireSlotScript()),
		renew:   goredis.NewScript(algorithms.RenewSlotScript()),
		release: goredis.NewScript(algorithms.ReleaseSlotScript()),
	}
}

func (s slotScripts) all() []*goredis.Script { return []*goredis.Script{s.acquire, s.renew, s.release} }

// AcquireSlot implements node.SlotStore. It goes through the checks' pipeline:
// a call resent after a Cluster redirection never ran, and an acquire run
// twice under one id takes one slot.
func (s *Store) AcquireSlot(ctx context.Context, base string, l algorithms.Limit, id string, cost int64) (algorithms.Decision, error) {
	reply, err := s.checkPipe.run(ctx, s.cfg.Timeout, s.slots.acquire, nil, algorithms.Keys(algorithms.Concurrency, base), algorithms.SlotArgs(l, id, cost, 0), nil)
	if err != nil {
		return algorithms.Decision{}, fmt.Errorf("redis acquire slot: %w", err)
	}
	d, err := algorithms.DecodeAcquireSlotReply(reply)
	if err != nil {
		return algorithms.Decision{}, fmt.Errorf("redis acquire slot: %w", err)
	}
	return d, nil
}

// RenewSlot implements node.SlotStore.
func (s *Store) RenewSlot(ctx context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	return s.slotCall(ctx, "renew", s.checkPipe, s.slots.renew, base, l, id)
}

// ReleaseSlot implements node.SlotStore. It goes through the releases'
// pipeline, which never resends: a release that ran and is sent again
// would report the slot as not held.
func (s *Store) ReleaseSlot(ctx context.Context, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	return s.slotCall(ctx, "release", s.releasePipe, s.slots.release, base, l, id)
}

func (s *Store) slotCall(ctx context.Context, op string, p *pipeline, sc *goredis.Script, base string, l algorithms.Limit, id string) (algorithms.Decision, bool, error) {
	reply, err := p.run(ctx, s.cfg.Timeout, sc, nil, algorithms.Keys(algorithms.Concurrency, base), algorithms.SlotArgs(l, id, 0, 0), nil)
	if err != nil {
		return algorithms.Decision{}, false, fmt.Errorf("redis %s slot: %w", op, err)
	}
	d, held, err := algorithms.DecodeSlotReply(reply)
	if err != nil {
		return algorithms.Decision{}, false, fmt.Errorf("redis %s slot: %w", op, err)
	}
	return d, held, nil
}
