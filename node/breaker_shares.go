package node

import (
	"context"
	"time"
)

// The share exchange of a remote store behind the breaker, as Acquire:
// refused at once while it is open, counted, and its outcome recorded.

func (s breakerStore) ExchangeShares(ctx context.Context, base, member string, round int64, vector string, ttl time.Duration) (map[string]string, error) {
	ss, ok := s.Store.(ShareStore)
	if !ok {
		return nil, ErrNoShares
	}
	if err := s.b.allow(); err != nil {
		return nil, err
	}
	s.b.calls.Add(1)
	out, err := ss.ExchangeShares(ctx, base, member, round, vector, ttl)
	s.b.record(ctx, err)
	return out, err
}
