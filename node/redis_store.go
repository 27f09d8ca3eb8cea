package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
)

// RedisConfig says how to reach the authoritative Redis.
type RedisConfig struct {
	// URL is redis://[user:password@]host:port/db or rediss:// for TLS.
	// Required.
	URL string
	// Timeout bounds each round trip to Redis: one pipelined batch of script
	// calls (and its retry after NOSCRIPT), or a reset. Time a call spends
	// queued for a pipeliner is bounded by the caller's context. Default
	// 100ms.
	Timeout time.Duration
}

// Validate reports the first problem with c.
func (c RedisConfig) Validate() error {
	if c.URL == "" {
		return fmt.Errorf("redis url: %w: must not be empty", ErrInvalidConfig)
	}
	if _, err := redis.ParseURL(c.URL); err != nil {
		return fmt.Errorf("redis url: %w: %v", ErrInvalidConfig, err)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("redis timeout: %w: %s must not be negative (0 means the default)", ErrInvalidConfig, c.Timeout)
	}
	return nil
}

func (c RedisConfig) withDefaults() RedisConfig {
	if c.Timeout == 0 {
		c.Timeout = 100 * time.Millisecond
	}
	return c
}

// RedisStore runs the algorithms' Lua scripts on Redis, the authority shared
// by every node. Script calls are pipelined (see redis_pipeline.go). Safe
// for concurrent use.
type RedisStore struct {
	client   redis.UniversalClient
	cfg      RedisConfig
	describe string
	check    map[algorithms.Algorithm]*redis.Script
	release  map[algorithms.Algorithm]*redis.Script
	pipe     *pipeline
	closed   sync.Once
}

// NewRedisStore connects to Redis, checks that it answers and loads every
// script (so the first checks do not pay for EVAL). It fails when Redis is
// unreachable: a node should not start against an authority it cannot reach.
func NewRedisStore(ctx context.Context, cfg RedisConfig) (*RedisStore, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts, _ := redis.ParseURL(cfg.URL) // validated above
	// No automatic retries: a script whose reply was lost may have run, and
	// running a release twice would hand back units twice. A failed call
	// takes the policy's failure mode instead.
	opts.MaxRetries = -1
	client := redis.NewClient(opts)
	s := &RedisStore{
		client:   client,
		cfg:      cfg,
		describe: fmt.Sprintf("redis %s db %d", opts.Addr, opts.DB),
		check:    make(map[algorithms.Algorithm]*redis.Script),
		release:  make(map[algorithms.Algorithm]*redis.Script),
	}
	if opts.TLSConfig != nil {
		s.describe += " (tls)"
	}
	for _, a := range algorithms.Algorithms() {
		s.check[a] = redis.NewScript(algorithms.CheckScript(a))
		s.release[a] = redis.NewScript(algorithms.ReleaseScript(a))
	}
	if err := s.loadScripts(ctx); err != nil {
		client.Close()
		return nil, err
	}
	s.pipe = newPipeline(client, cfg.Timeout, s.loadScripts)
	return s, nil
}

// loadScripts loads every script into Redis's script cache.
func (s *RedisStore) loadScripts(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, scripts := range []map[algorithms.Algorithm]*redis.Script{s.check, s.release} {
		for a, sc := range scripts {
			if err := sc.Load(ctx, s.client).Err(); err != nil {
				return fmt.Errorf("load %s script on %s: %w", a, s.describe, err)
			}
		}
	}
	return nil
}

// Acquire implements Store.
func (s *RedisStore) Acquire(ctx context.Context, base string, l algorithms.Limit, cost, want int64, hold time.Duration) (algorithms.Decision, algorithms.Grant, error) {
	sc := s.check[l.Algorithm]
	if sc == nil {
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check: %w %d", algorithms.ErrUnknownAlgorithm, int(l.Algorithm))
	}
	reply, err := s.pipe.run(ctx, sc, algorithms.Keys(l.Algorithm, base), algorithms.AcquireArgs(l, cost, want, hold, 0))
	if err != nil {
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check %s: %w", l.Algorithm, err)
	}
	d, g, err := algorithms.DecodeAcquireReply(reply)
	if err != nil {
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check %s: %w", l.Algorithm, err)
	}
	return d, g, nil
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	sc := s.release[l.Algorithm]
	if sc == nil {
		return 0, fmt.Errorf("redis release: %w %d", algorithms.ErrUnknownAlgorithm, int(l.Algorithm))
	}
	reply, err := s.pipe.run(ctx, sc, algorithms.Keys(l.Algorithm, base), algorithms.ReleaseArgs(l, units, g, 0))
	if err != nil {
		return 0, fmt.Errorf("redis release %s: %w", l.Algorithm, err)
	}
	returned, err := algorithms.DecodeReleaseReply(reply)
	if err != nil {
		return 0, fmt.Errorf("redis release %s: %w", l.Algorithm, err)
	}
	return returned, nil
}

// Remote implements Store: every call is a network round trip.
func (s *RedisStore) Remote() bool { return true }

// PipelineStats reports how many script calls the store made and in how
// many round trips (a retry after NOSCRIPT counts as one more).
func (s *RedisStore) PipelineStats() (calls, roundTrips int64) {
	return s.pipe.calls.Load(), s.pipe.roundTrips.Load()
}

// Reset implements Store. All keys of one base share a hash tag, so one DEL
// covers them even on Redis Cluster.
func (s *RedisStore) Reset(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.client.Del(ctx, algorithms.AllKeys(base)...).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redis reset: %w", err)
	}
	return nil
}

// Describe implements Store.
func (s *RedisStore) Describe() string { return s.describe }

// Close implements Store: queued calls fail, then the connections close.
// Calls after the first return nil.
func (s *RedisStore) Close() error {
	var err error
	s.closed.Do(func() {
		s.pipe.close()
		err = s.client.Close()
	})
	return err
}
