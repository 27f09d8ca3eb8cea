// Package redisbench is the Redis access quotabench needs beside quotad:
// INFO readings (server, commandstats, cpu) from the Redis quotad uses,
// and the Redis floor, envoyproxy/ratelimit's pipelined INCRBY+PEXPIRE
// counter sent straight to Redis. It keeps go-redis out of cmd/quotabench:
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

// Close closes the client's connections.
func (c *Client) Close() error { return c.c.Close() }
