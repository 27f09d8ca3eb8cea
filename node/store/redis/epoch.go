package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// This file names the state Redis holds (run_id and a marker key), so that
// a node notices a restart, failover or flush.

// markerTTL is how long the state marker outlives the last node that
// checked it; a marker that expired only makes the next check see a new
// state, which costs the nodes their leases and cached denials once.
const markerTTL = 24 * time.Hour

// Epoch names the state Redis holds now: the run_id of every primary
// (INFO server) and the value of the state marker, the key marker, which
// the first Epoch after the marker went missing sets. Any change means the
// state may have been lost or replaced since the last call — a restart (a
// new run_id even when persistence brought the data back, since the last
// second of writes may be gone), a failover to a replica (which may lag),
// a FLUSHALL or FLUSHDB (the marker is gone; on Redis Cluster only if the
// marker's master is flushed) — and that a node should drop what it took
// from the old state. It may block on the network until ctx is done.
func (s *Store) Epoch(ctx context.Context, marker string) (string, error) {
	token := make([]byte, 8)
	_, _ = rand.Read(token) // never fails (crypto/rand)
	// One transaction of plain commands rather than a script, so that the
	// marker never shows in the script counts operators and tests read: the
	// marker is set when missing (a new Redis, one restarted without its
	// data, a FLUSHALL), its TTL renewed, and its value read.
	var get *goredis.StringCmd
	_, err := s.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.SetNX(ctx, marker, hex.EncodeToString(token), markerTTL)
		p.PExpire(ctx, marker, markerTTL)
		get = p.Get(ctx, marker)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("redis epoch: marker: %w", err)
	}
	mark := get.Val()
	ids, err := s.runIDs(ctx)
	if err != nil {
		return "", err
	}
	return strings.Join(ids, ",") + " " + mark, nil
}

// runIDs returns the run_id of the primary, or on Redis Cluster every
// primary's as address=run_id, sorted.
func (s *Store) runIDs(ctx context.Context) ([]string, error) {
	cc, ok := s.client.(*goredis.ClusterClient)
	if !ok {
		id, err := runID(ctx, s.client)
		if err != nil {
			return nil, err
		}
		return []string{id}, nil
	}
	var mu sync.Mutex
	var ids []string
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
		id, err := runID(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		ids = append(ids, c.Options().Addr+"="+id)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(ids)
	return ids, nil
}

// errNoRunID means INFO server had no run_id line.
var errNoRunID = errors.New("no run_id in INFO server")

// runID reads the run_id line of INFO server.
func runID(ctx context.Context, c goredis.Cmdable) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("redis epoch: INFO server: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok && id != "" {
			return id, nil
		}
	}
	return "", fmt.Errorf("redis epoch: %w", errNoRunID)
}
