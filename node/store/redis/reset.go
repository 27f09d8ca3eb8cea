package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/quotad/quotad/algorithms"
	goredis "github.com/redis/go-redis/v9"
)

// This file is Reset: forgetting a key's state, or every state of an
// inline namespace, found by SCAN on each primary.

// Reset implements node.Store. All keys of one base share a hash tag, so one DEL
// covers them even on Redis Cluster.
func (s *Store) Reset(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.client.Del(ctx, algorithms.AllKeys(base)...).Err(); err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redis reset: %w", err)
	}
	return nil
}

// ResetLimit implements node.LimitResetter: Reset, and for a window
// algorithm the keys of its windows that may count now
// (algorithms.WindowKey): the window Redis's clock is in, the one before
// it (the sliding counter's previous window; a check the node decided
// just before the turn) and the one after it (the clock may turn during
// the reset), read from TIME on the primary that serves base. A window
// has no key that lists it, so only those are found; any earlier window
// has ended and counts nothing.
func (s *Store) ResetLimit(ctx context.Context, base string, l algorithms.Limit) error {
	if !algorithms.HasWindowKeys(l.Algorithm) {
		return s.Reset(ctx, base)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var primary goredis.Cmdable = s.client
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		c, err := cc.MasterForKey(ctx, base)
		if err != nil {
			return fmt.Errorf("redis reset: find the primary of %s: %w", base, err)
		}
		primary = c
	}
	now, err := primary.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("redis reset: read the clock: %w", err)
	}
	p := l.PeriodMillis()
	ms := now.UnixMilli()
	w := ms - ms%p
	keys := algorithms.AllKeys(base)
	prefix := algorithms.Keys(l.Algorithm, base)[0]
	for _, start := range []int64{w - p, w, w + p} {
		keys = append(keys, algorithms.WindowKey(prefix, p, start))
	}
	if err := s.client.Del(ctx, keys...).Err(); err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redis reset: %w", err)
	}
	return nil
}

// ResetInline implements node.Store. Nothing records which inline limits a key
// was checked with (a record would be a second key in every check script,
// and a script whose keys a slot migration has split between two primaries
// fails), so it finds them with SCAN on the primary that serves the
// family's slot, resetScanCount keys a step, each step bounded by the
// store's timeout: about one round trip per thousand keys on that primary.
// SCAN returns every key that exists throughout the scan; an inline limit
// first written during it is a check that ran after the reset began.
func (s *Store) ResetInline(ctx context.Context, family string) error {
	var node goredis.Cmdable = s.client
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		c, err := cc.MasterForKey(ctx, family)
		if err != nil {
			return fmt.Errorf("redis reset: find the primary of %s: %w", family, err)
		}
		node = c
	}
	pattern := globEscape(family) + "/*"
	var cursor uint64
	for {
		keys, next, err := s.scanStep(ctx, node, cursor, pattern)
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := s.del(ctx, keys); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

func (s *Store) scanStep(ctx context.Context, node goredis.Cmdable, cursor uint64, pattern string) ([]string, uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	keys, next, err := node.Scan(ctx, cursor, pattern, resetScanCount).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("redis reset: scan for inline limits: %w", err)
	}
	return keys, next, nil
}

func (s *Store) del(ctx context.Context, keys []string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.client.Del(ctx, keys...).Err(); err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("redis reset: %w", err)
	}
	return nil
}

// globEscape quotes s for a SCAN MATCH pattern: every byte literal.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\', '^':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
