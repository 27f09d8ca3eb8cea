package memcache

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Defaults of Config's zero fields.
const (
	// DefaultTimeout bounds one call as its caller sees it.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultMaxIdleConns is how many idle connections are kept per
	// server: gomemcache's default, and so envoyproxy/ratelimit's.
	DefaultMaxIdleConns = 2
)

// Config is the memcached store's configuration.
type Config struct {
	// Addrs are the servers, host:port each, in the order every node must
	// list them (keys are spread by it). At least one, unless SRV.
	Addrs []string
	// SRV, instead of Addrs, is a DNS SRV record that lists the servers:
	// _service._proto.name, as envoyproxy/ratelimit's MEMCACHE_SRV. New
	// looks it up, and fails if it cannot; the servers are its targets and
	// ports, sorted, so that every node that sees the same records spreads
	// keys alike.
	SRV string
	// SRVRefresh, when positive, looks SRV up again this often, and a
	// changed list replaces the servers; a failed look-up keeps them.
	// Zero looks it up once.
	SRVRefresh time.Duration
	// Resolver looks SRV up; nil means net.DefaultResolver.
	Resolver *net.Resolver
	// Timeout bounds one call, its connection's dial included; zero means
	// DefaultTimeout. Ping, which the circuit breaker probes with, may
	// take ten times as long.
	Timeout time.Duration
	// MaxIdleConns is how many idle connections each server keeps for
	// the next calls; zero means DefaultMaxIdleConns. A call that finds
	// none idle opens one, and closes it after unless it may stay idle.
	MaxIdleConns int
	// TLS, when not nil, makes every connection TLS with it; the server
	// name, when it does not say, is the host of the server's address. nil
	// is cleartext.
	TLS *tls.Config
	// Now is the clock windows are aligned to; nil means time.Now.
	Now func() time.Time
}

// ErrInvalidConfig is what every error of Validate wraps.
var ErrInvalidConfig = errors.New("invalid memcache config")

// Validate reports the first problem with c, saying what to write.
func (c Config) Validate() error {
	switch {
	case len(c.Addrs) > 0 && c.SRV != "":
		return fmt.Errorf("%w: both servers and an SRV record are set; set one", ErrInvalidConfig)
	case c.SRV != "":
		if _, _, _, ok := splitSRV(c.SRV); !ok {
			return fmt.Errorf("%w: SRV record %q: want _service._proto.name, e.g. _memcache._tcp.example.com", ErrInvalidConfig, c.SRV)
		}
	case len(c.Addrs) == 0:
		return fmt.Errorf("%w: no server; list them as host:port,host:port", ErrInvalidConfig)
	}
	if c.SRVRefresh < 0 {
		return fmt.Errorf("%w: SRV refresh %s must not be negative (0 looks the record up once)", ErrInvalidConfig, c.SRVRefresh)
	}
	for _, a := range c.Addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return fmt.Errorf("%w: server %q: want host:port, e.g. memcached:11211", ErrInvalidConfig, a)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("%w: server %q: the port must be a number from 1 to 65535", ErrInvalidConfig, a)
		}
	}
	if c.Timeout < 0 {
		return fmt.Errorf("%w: timeout %s must not be negative (0 means %s)", ErrInvalidConfig, c.Timeout, DefaultTimeout)
	}
	if c.MaxIdleConns < 0 {
		return fmt.Errorf("%w: max idle conns %d must not be negative (0 means %d)", ErrInvalidConfig, c.MaxIdleConns, DefaultMaxIdleConns)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = DefaultMaxIdleConns
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	return c
}
