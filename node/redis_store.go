package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
)

// RedisConfig says how to reach the authoritative Redis.
type RedisConfig struct {
	// URL is redis://[user:password@]host:port/db or rediss:// for TLS.
	// Required.
	URL string
	// Timeout bounds each store call (script run or reset), in addition to
	// the caller's context. Default 100ms.
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
		return fmt.Errorf("redis timeout: %w: %s must be > 0", ErrInvalidConfig, c.Timeout)
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
// by every node. Safe for concurrent use.
type RedisStore struct {
	client   redis.UniversalClient
	cfg      RedisConfig
	describe string
	scripts  map[algorithms.Algorithm]*redis.Script
	allKeys  func(base string) []string
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
	client := redis.NewClient(opts)
	s := &RedisStore{
		client:   client,
		cfg:      cfg,
		describe: fmt.Sprintf("redis %s db %d", opts.Addr, opts.DB),
		scripts:  make(map[algorithms.Algorithm]*redis.Script),
		allKeys:  algorithms.AllKeys,
	}
	if opts.TLSConfig != nil {
		s.describe += " (tls)"
	}
	for _, a := range algorithms.Algorithms() {
		s.scripts[a] = redis.NewScript(algorithms.CheckScript(a))
	}
	if err := s.loadScripts(ctx); err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// loadScripts loads every script into Redis's script cache.
func (s *RedisStore) loadScripts(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for a, sc := range s.scripts {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("load %s script on %s: %w", a, s.describe, err)
		}
	}
	return nil
}

// Check implements Store.
func (s *RedisStore) Check(ctx context.Context, base string, l algorithms.Limit, cost int64) (algorithms.Decision, error) {
	sc := s.scripts[l.Algorithm]
	if sc == nil {
		return algorithms.Decision{}, fmt.Errorf("redis check: %w %d", algorithms.ErrUnknownAlgorithm, int(l.Algorithm))
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	// Run uses EVALSHA and falls back to EVAL (which reloads the script) on
	// NOSCRIPT, so a restarted or failed-over Redis heals on first use.
	reply, err := sc.Run(ctx, s.client, algorithms.Keys(l.Algorithm, base), algorithms.CheckArgs(l, cost, 0)...).Result()
	if err != nil {
		return algorithms.Decision{}, fmt.Errorf("redis check %s: %w", l.Algorithm, err)
	}
	d, err := algorithms.DecodeCheckReply(reply)
	if err != nil {
		return algorithms.Decision{}, fmt.Errorf("redis check %s: %w", l.Algorithm, err)
	}
	return d, nil
}

// Reset implements Store. All keys of one base share a hash tag, so one DEL
// covers them even on Redis Cluster.
func (s *RedisStore) Reset(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.client.Del(ctx, s.allKeys(base)...).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("redis reset: %w", err)
	}
	return nil
}

// Describe implements Store.
func (s *RedisStore) Describe() string { return s.describe }

// Close implements Store.
func (s *RedisStore) Close() error { return s.client.Close() }
