package memory

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// The members' published demand (node.ShareStore) in memory, as the Redis
// store keeps it: per base, each member's vectors of its last two rounds,
// until ttl after the base's last write. One node uses the memory store,
// so it is the only member; it still reads its round-1 vector, as every
// member would.

// shareTable holds the published vectors; the zero value is empty.
type shareTable struct {
	mu    sync.Mutex
	bases map[string]*shareBase
}

type shareBase struct {
	expires time.Time
	// rounds holds member|parity → round and vector.
	rounds map[string]shareRecord
}

type shareRecord struct {
	round  int64
	vector string
}

// ExchangeShares implements node.ShareStore.
func (s *Store) ExchangeShares(_ context.Context, base, member string, round int64, vector string, ttl time.Duration) (map[string]string, error) {
	now := s.now()
	t := &s.shares
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bases == nil {
		t.bases = map[string]*shareBase{}
	}
	for k, b := range t.bases {
		if !now.Before(b.expires) {
			delete(t.bases, k)
		}
	}
	b := t.bases[base]
	if b == nil {
		b = &shareBase{rounds: map[string]shareRecord{}}
		t.bases[base] = b
	}
	b.expires = now.Add(ttl)
	b.rounds[member+"|"+strconv.FormatInt(((round%2)+2)%2, 10)] = shareRecord{round, vector}
	out := map[string]string{}
	for f, r := range b.rounds {
		switch {
		case r.round == round-1:
			out[f[:len(f)-2]] = r.vector
		case r.round < round-1:
			delete(b.rounds, f)
		}
	}
	return out, nil
}
