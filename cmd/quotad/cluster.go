package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/node/cluster"
	"github.com/quotad/quotad/node/store/memcache"
	"github.com/quotad/quotad/node/store/redis"
)

// clusterConfig makes this node a member of a quotad cluster. The zero
// value (no Addr) runs standalone.
type clusterConfig struct {
	// Addr is the gossip bind address, host:port (UDP and TCP).
	Addr string
	// Advertise is the address the others reach this node at, when it
	// differs from Addr.
	Advertise string
	// Join lists seeds, host:port; a DNS name stands for all its
	// addresses.
	Join []string
	// NodeName names this node; default hostname:port.
	NodeName string
	// KeyFile holds the shared gossip key (see readClusterKey).
	KeyFile string
	// Insecure allows gossip without KeyFile: plaintext and
	// unauthenticated. Without either, a cluster does not start.
	Insecure bool
	// DeadAfter and RejoinInterval tune membership; 0 takes node's
	// defaults (5s, 10s).
	DeadAfter, RejoinInterval time.Duration
	// APIPort is the port of the members' API, at the host of their
	// gossip address, which GET /status?scope=cluster asks; 0 means the
	// port of --listen.
	APIPort int
}

// validate checks the cluster settings against the store: a cluster needs
// one store every node shares.
func (c clusterConfig) validate(sharedStore bool) error {
	if c.Addr == "" {
		if c.Advertise != "" || len(c.Join) > 0 || c.NodeName != "" || c.KeyFile != "" || c.Insecure || c.DeadAfter != 0 || c.RejoinInterval != 0 || c.APIPort != 0 {
			return errors.New("cluster: --join, --cluster-advertise, --node-name, --cluster-key-file, --cluster-insecure, --cluster-api-port and the timings need --cluster-addr, the gossip address")
		}
		return nil
	}
	if c.APIPort < 0 || c.APIPort > 65535 {
		return fmt.Errorf("cluster: --cluster-api-port %d: want the members' API port, 1 to 65535, or 0 for the port of --listen", c.APIPort)
	}
	if !sharedStore {
		return errors.New("cluster: --cluster-addr needs Redis (--redis, --redis-cluster or --redis-sentinel) or memcached (--memcache): on the embedded memory store every node keeps its own counters, so a cluster would admit each limit once per node; configure one store that every node shares")
	}
	mc, err := c.membershipConfig()
	if err != nil {
		return err
	}
	if err := mc.Validate(); err != nil {
		return err
	}
	switch {
	case c.KeyFile == "" && !c.Insecure:
		return errors.New("cluster: --cluster-addr needs --cluster-key-file, the same key on every node (make one with: openssl rand -base64 32): without a key gossip is neither encrypted nor authenticated, and anyone who reaches the gossip port can join the cluster and forge its gossip; pass --cluster-insecure to run without one anyway")
	case c.KeyFile != "" && c.Insecure:
		return errors.New("cluster: --cluster-insecure and --cluster-key-file contradict each other; drop one")
	}
	return nil
}

// membershipConfig is node's view of c; it reads the key file.
func (c clusterConfig) membershipConfig() (cluster.Config, error) {
	mc := cluster.Config{
		NodeName: c.NodeName, BindAddr: c.Addr, AdvertiseAddr: c.Advertise, Join: c.Join,
		DeadAfter: c.DeadAfter, RejoinInterval: c.RejoinInterval,
	}
	if c.KeyFile != "" {
		key, err := readClusterKey(c.KeyFile)
		if err != nil {
			return cluster.Config{}, err
		}
		mc.SecretKey = key
	}
	return mc, nil
}

// readClusterKey reads the gossip key at path: base64 of a 16, 24 or
// 32-byte key (surrounding whitespace ignored), or exactly 16, 24 or 32
// raw bytes. Every node reads the same file the same way, so a file that
// happens to be both is still one key cluster-wide.
func readClusterKey(path string) ([]byte, error) {
	raw, err := readFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster key file: %w", err)
	}
	if k, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(raw))); err == nil && validKeyLen(len(k)) {
		return k, nil
	}
	if validKeyLen(len(raw)) {
		return raw, nil
	}
	return nil, fmt.Errorf("cluster key file %s: holds %d bytes, neither base64 of a 16, 24 or 32-byte key nor such a key raw (make one with: openssl rand -base64 32)", path, len(raw))
}

func validKeyLen(n int) bool { return n == 16 || n == 24 || n == 32 }

// openCluster starts this node's membership, or returns nil when it runs
// standalone. Members refuse peers with another key prefix or store.
func openCluster(cfg config, log *slog.Logger) (*cluster.Membership, error) {
	if cfg.Cluster.Addr == "" {
		return nil, nil
	}
	mc, err := cfg.Cluster.membershipConfig()
	if err != nil {
		return nil, err
	}
	mc.KeyPrefix, mc.StoreID = cfg.KeyPrefix, redisIdentity(cfg.Redis)
	if cfg.usesMemcache() {
		mc.StoreID = memcacheIdentity(cfg.Memcache)
	}
	m, err := cluster.New(mc, log)
	if err != nil {
		return nil, err
	}
	if mc.SecretKey == nil {
		log.Warn("cluster gossip is neither encrypted nor authenticated (--cluster-insecure): anyone who reaches --cluster-addr can join the cluster, read its gossip and forge denials and resets; give every node the same --cluster-key-file instead")
	}
	return m, nil
}

// memcacheIdentity names the memcached servers, for members to compare:
// lower-cased, in their order, which spreads the keys (two nodes that list
// them in another order count one key on different servers), or the SRV
// record that lists them.
func memcacheIdentity(m memcache.Config) string {
	if m.SRV != "" {
		return "memcache srv " + strings.ToLower(m.SRV)
	}
	return "memcache " + strings.ToLower(strings.Join(m.Addrs, ","))
}

// redisIdentity names the Redis that r points at, for members to compare:
// for a URL its host:port (lower-cased; port 6379 when absent) and
// database, for Sentinel the master's name and database, for Cluster its
// seeds, lower-cased and sorted. Two nodes that name one Redis differently
// (a name and an IP, other seeds) refuse each other; the log says so. It
// never holds credentials or TLS settings. r must be valid.
func redisIdentity(r redis.Config) string {
	switch {
	case r.URL != "":
		u, err := url.Parse(r.URL)
		if err != nil {
			return "redis " + r.URL // validated: does not happen
		}
		port := u.Port()
		if port == "" {
			port = "6379"
		}
		db, err := strconv.Atoi(strings.TrimPrefix(u.Path, "/"))
		if err != nil {
			db = 0 // no path: database 0
		}
		return fmt.Sprintf("redis %s db %d", net.JoinHostPort(strings.ToLower(u.Hostname()), port), db)
	case len(r.ClusterAddrs) > 0:
		addrs := make([]string, len(r.ClusterAddrs))
		for i, a := range r.ClusterAddrs {
			addrs[i] = strings.ToLower(a)
		}
		slices.Sort(addrs)
		return "redis cluster " + strings.Join(slices.Compact(addrs), ",")
	default:
		return fmt.Sprintf("redis sentinel master %s db %d", r.MasterName, r.DB)
	}
}
