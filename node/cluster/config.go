package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/quotad/quotad/node"
)

// This file is a member's configuration: Config, its defaults and checks.

// Defaults of Config.
const (
	// DefaultDeadAfter is how long a member that stopped answering stays
	// counted: memberlist then probes every 500ms.
	DefaultDeadAfter = 5 * time.Second
	// DefaultRejoinInterval is how often the rejoin loop contacts seeds and
	// dead members that are not in this node's view.
	DefaultRejoinInterval = 10 * time.Second
	// DefaultForgetDeadAfter is how long the rejoin loop keeps trying the
	// address of a member that died.
	DefaultForgetDeadAfter = 10 * time.Minute
	// MinDeadAfter is the smallest DeadAfter: memberlist then probes every
	// 10ms, about as fast as a loopback test can keep up with.
	MinDeadAfter = 100 * time.Millisecond
	// DefaultGossipMaxAge is how far a gossip packet's send time may lie
	// from the receiver's clock: members' clocks must agree that well.
	DefaultGossipMaxAge = 10 * time.Second
	// MinGossipMaxAge is the smallest GossipMaxAge.
	MinGossipMaxAge = 100 * time.Millisecond
)

// Config configures this node's membership in a quotad cluster.
// The zero value is not valid: BindAddr (or, in tests, Transport) is
// required. Build it, then New applies defaults and validates.
type Config struct {
	// NodeName names this node to the others; unique in the cluster.
	// Default "<hostname>:<gossip port>".
	NodeName string
	// BindAddr is the gossip address, "host:port" (UDP and TCP on the same
	// port); host is an IP address, or empty for every interface. Ignored
	// when Transport is set.
	BindAddr string
	// AdvertiseAddr is the "host:port" the other nodes reach this one at,
	// when it differs from BindAddr (NAT, containers); host is an IP or a
	// name resolved once at start. Default: BindAddr's, or this host's
	// private IP when bound to every interface.
	AdvertiseAddr string
	// Join lists seeds, "host:port" or "host" (then the port is this
	// node's gossip port). A host that is a DNS name stands for every
	// address it resolves to — a Kubernetes headless service names every
	// pod. Seeds are resolved again on each rejoin. Empty: this node waits
	// for others to join it.
	Join []string
	// SecretKey encrypts and authenticates all gossip (AES-GCM); 16, 24 or
	// 32 bytes for AES-128, -192 or -256. Every node needs the same key; a
	// node with another key, or none, is refused. nil: plaintext gossip,
	// which anyone who reaches the address can read, join and forge
	// (received denials are still held to what their limit can justify);
	// cmd/quotad allows it only with --cluster-insecure.
	SecretKey []byte
	// KeyPrefix and StoreID name the data this node limits: its Redis key
	// prefix, and the Redis it limits on (cmd/quotad: the address and
	// database of one server, the master name of a Sentinel set or the
	// seeds of a Cluster; never credentials, as it appears in logs). Members
	// advertise a hash of each and refuse, with a log line saying which
	// differs, a peer whose either differs: its denials and resets would
	// apply to other counters. Empty values are values like any other.
	KeyPrefix, StoreID string
	// GossipMaxAge is how far from this node's clock a gossip packet's
	// send time may lie; older (or newer) packets are dropped as stale, so
	// a captured packet cannot be played back later. Members' clocks must
	// agree within it (NTP does far better). Default DefaultGossipMaxAge;
	// at least MinGossipMaxAge.
	GossipMaxAge time.Duration
	// DeadAfter is how long after a member stops answering the others
	// declare it dead and stop counting it, for clusters of up to about ten
	// nodes (memberlist probes every DeadAfter/10 and suspects a member for
	// four probe intervals, scaled by log10 of the cluster size beyond
	// ten). It also bounds the stream timeout. Default DefaultDeadAfter; at
	// least MinDeadAfter.
	DeadAfter time.Duration
	// RejoinInterval is how often this node re-joins seeds and dead
	// members it does not see as alive, which heals partitions (memberlist
	// never contacts a dead member again by itself). While the node sees no
	// other member it retries every second at most. Default
	// DefaultRejoinInterval.
	RejoinInterval time.Duration
	// ForgetDeadAfter is how long the rejoin loop keeps trying a dead
	// member's address. Default DefaultForgetDeadAfter.
	ForgetDeadAfter time.Duration
	// Transport replaces memberlist's UDP and TCP transport (tests use an
	// in-memory network); nil uses the network at BindAddr.
	Transport memberlist.NodeAwareTransport
	// LookupHost resolves a seed's or the advertise address's host name to
	// addresses; nil uses net.DefaultResolver.LookupHost.
	LookupHost func(ctx context.Context, host string) ([]string, error)
}

// probeInterval is memberlist's ProbeInterval for c (after defaults).
func (c Config) probeInterval() time.Duration { return c.DeadAfter / 10 }

// gossipInterval is how often queued gossip goes out when it cannot
// piggyback on probes: memberlist's default, or faster with fast probes.
func (c Config) gossipInterval() time.Duration {
	return min(200*time.Millisecond, c.probeInterval())
}

func (c Config) withDefaults() Config {
	if c.DeadAfter == 0 {
		c.DeadAfter = DefaultDeadAfter
	}
	if c.RejoinInterval == 0 {
		c.RejoinInterval = DefaultRejoinInterval
	}
	if c.ForgetDeadAfter == 0 {
		c.ForgetDeadAfter = DefaultForgetDeadAfter
	}
	if c.LookupHost == nil {
		c.LookupHost = net.DefaultResolver.LookupHost
	}
	if c.GossipMaxAge == 0 {
		c.GossipMaxAge = DefaultGossipMaxAge
	}
	return c
}

// Validate reports the first problem with c, with defaults applied to
// unset fields, naming the field.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.Transport == nil {
		if c.BindAddr == "" {
			return fmt.Errorf("cluster bind address: %w: required (host:port)", node.ErrInvalidConfig)
		}
		host, _, err := splitAddr(c.BindAddr, false)
		if err != nil {
			return fmt.Errorf("cluster bind address: %w", err)
		}
		if host != "" && net.ParseIP(host) == nil {
			return fmt.Errorf("cluster bind address: %w: %q is not an IP address (bind to an IP, or leave the host empty for every interface)", node.ErrInvalidConfig, host)
		}
	}
	if c.AdvertiseAddr != "" {
		if host, _, err := splitAddr(c.AdvertiseAddr, false); err != nil {
			return fmt.Errorf("cluster advertise address: %w", err)
		} else if host == "" {
			return fmt.Errorf("cluster advertise address: %w: %q has no host", node.ErrInvalidConfig, c.AdvertiseAddr)
		}
	}
	for i, s := range c.Join {
		if host, _, err := splitAddr(s, true); err != nil {
			return fmt.Errorf("join[%d]: %w", i, err)
		} else if host == "" {
			return fmt.Errorf("join[%d]: %w: %q has no host", i, node.ErrInvalidConfig, s)
		}
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		return fmt.Errorf("cluster key: %w: %d bytes; want 16, 24 or 32", node.ErrInvalidConfig, len(c.SecretKey))
	}
	switch {
	case c.DeadAfter < MinDeadAfter:
		return fmt.Errorf("cluster dead after: %w: %s must be at least %s", node.ErrInvalidConfig, c.DeadAfter, MinDeadAfter)
	case c.RejoinInterval < 0:
		return fmt.Errorf("cluster rejoin interval: %w: %s must be > 0", node.ErrInvalidConfig, c.RejoinInterval)
	case c.ForgetDeadAfter < 0:
		return fmt.Errorf("cluster forget dead after: %w: %s must be > 0", node.ErrInvalidConfig, c.ForgetDeadAfter)
	case c.GossipMaxAge < MinGossipMaxAge:
		return fmt.Errorf("cluster gossip max age: %w: %s must be at least %s", node.ErrInvalidConfig, c.GossipMaxAge, MinGossipMaxAge)
	}
	return nil
}

// splitAddr splits "host:port". With portOptional, a bare host (no colon)
// returns port 0, meaning this node's gossip port.
func splitAddr(s string, portOptional bool) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		if portOptional && !strings.Contains(s, ":") && s != "" {
			return s, 0, nil
		}
		return "", 0, fmt.Errorf("%w: %q is not host:port", node.ErrInvalidConfig, s)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, fmt.Errorf("%w: port %q of %q must be 1 to 65535", node.ErrInvalidConfig, p, s)
	}
	return h, n, nil
}
