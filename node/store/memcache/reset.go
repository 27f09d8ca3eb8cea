package memcache

import (
	"context"
	"fmt"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// This file is Reset: a window is found by its limit's period, and
// memcached cannot list keys.

// ResetLimit implements node.LimitResetter: it deletes the counter of l's
// window now under base, and of the window before it, which a node whose
// clock runs behind may still count in.
func (s *Store) ResetLimit(ctx context.Context, base string, l algorithms.Limit) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	p := l.PeriodMillis()
	now := s.cfg.Now().UnixMilli()
	w := now - now%p
	for _, start := range []int64{w, w - p} {
		if err := s.client.del(ctx, windowKey(base, start)); err != nil {
			return fmt.Errorf("memcache reset: %w", err)
		}
	}
	return nil
}

// Reset implements node.Store. Without the limit the window's key is not
// known (the node resets a configured policy with ResetLimit), so it fails
// with node.ErrResetUnsupported.
func (s *Store) Reset(ctx context.Context, base string) error {
	return fmt.Errorf("memcache: %w: an inline limit's window is found only with its limit, and memcached cannot list its keys; the window ends by itself", node.ErrResetUnsupported)
}

// ResetInline implements node.Store: memcached cannot list the inline
// limits checked under family, so it fails with node.ErrResetUnsupported.
func (s *Store) ResetInline(ctx context.Context, family string) error {
	return fmt.Errorf("memcache: %w: memcached cannot list the inline limits checked under a key; each window ends by itself", node.ErrResetUnsupported)
}
