// Package redisbench is the Redis access quotabench needs beside quotad:
// INFO readings (server, commandstats, cpu) from the Redis quotad uses,
// and the Redis floors sent straight to Redis: envoyproxy/ratelimit's
// pipelined INCRBY+PEXPIRE counter, and the sorted-set sliding log. It keeps go-redis out of cmd/quotabench:
// go-redis's home is the Redis store (node/store/redis), and this package
// and the test helpers are its only other importers.
package redisbench

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Client is a connection pool to one Redis. Safe for concurrent use.
type Client struct {
	c *redis.Client
}

// CheckAddr reports whether addr is a redis:// or rediss:// URL, or
// host:port.
func CheckAddr(addr string) error {
	_, err := options(addr)
	return err
}

// Dial returns a client of the Redis at addr (as CheckAddr accepts) with
// up to poolSize connections. It does no I/O.
func Dial(addr string, poolSize int) (*Client, error) {
	opts, err := options(addr)
	if err != nil {
		return nil, err
	}
	opts.PoolSize = poolSize
	return &Client{c: redis.NewClient(opts)}, nil
}

// DialOne returns a client of the Redis at addr that keeps one connection,
// for INFO readings: its handshake (HELLO, CLIENT SETINFO) happens before
// the first reading, so it never lands between two readings, and the only
// commands it adds to the server's figures are its own INFO calls.
func DialOne(addr string) (*Client, error) {
	opts, err := options(addr)
	if err != nil {
		return nil, err
	}
	opts.PoolSize = 1
	opts.MinIdleConns = 0
	opts.MaxRetries = 0
	return &Client{c: redis.NewClient(opts)}, nil
}

// options parses addr: a redis:// or rediss:// URL, or host:port.
func options(s string) (*redis.Options, error) {
	if strings.Contains(s, "://") {
		opts, err := redis.ParseURL(s)
		if err != nil {
			return nil, fmt.Errorf("%q: %v", s, err)
		}
		return opts, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return nil, fmt.Errorf("%q is neither host:port nor a redis:// URL: %v", s, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || host == "" {
		return nil, fmt.Errorf("%q is neither host:port nor a redis:// URL", s)
	}
	return &redis.Options{Addr: s}, nil
}

// Ping sends PING.
func (c *Client) Ping(ctx context.Context) error { return c.c.Ping(ctx).Err() }

// Info returns INFO section's text.
func (c *Client) Info(ctx context.Context, section string) (string, error) {
	return c.c.Info(ctx, section).Result()
}

// IncrExpire is one operation of the Redis floor: INCRBY key 1 and
// PEXPIRE key ttl, in one pipeline.
func (c *Client) IncrExpire(ctx context.Context, key string, ttl time.Duration) error {
	pipe := c.c.Pipeline()
	pipe.IncrBy(ctx, key, 1)
	pipe.PExpire(ctx, key, ttl)
	_, err := pipe.Exec(ctx)
	return err
}

// LogAppend is one operation of the sorted-set floor: the common recipe
// for a sliding log in Redis, pipelined as the counter floor is. It drops
// the entries of key at or before nowMs less ttl (ZREMRANGEBYSCORE), adds
// member at nowMs (ZADD), counts the entries (ZCARD) and sets the key's
// TTL (PEXPIRE). member must be new to key. Pipelined, it is not a rate
// limiter (two clients both add, then both count) and it records denied
// requests too: it is what the commands alone cost.
func (c *Client) LogAppend(ctx context.Context, key, member string, nowMs int64, ttl time.Duration) error {
	pipe := c.c.Pipeline()
	pipe.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(nowMs-ttl.Milliseconds(), 10))
	pipe.ZAdd(ctx, key, redis.Z{Score: float64(nowMs), Member: member})
	pipe.ZCard(ctx, key)
	pipe.PExpire(ctx, key, ttl)
	_, err := pipe.Exec(ctx)
	return err
}

// LogCheck is one operation of the scripted sorted-set floor: the same
// recipe made exact, in one script call. It drops the expired entries,
// counts what is left, and adds member at nowMs (and sets the TTL) only if
// fewer than limit are there. It reports whether it added member.
func (c *Client) LogCheck(ctx context.Context, key, member string, nowMs int64, ttl time.Duration, limit int64) (bool, error) {
	n, err := logCheck.Run(ctx, c.c, []string{key}, member, nowMs, ttl.Milliseconds(), limit).Int()
	return n == 1, err
}

var logCheck = redis.NewScript(`
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
`)

// Close closes the client's connections.
func (c *Client) Close() error { return c.c.Close() }
