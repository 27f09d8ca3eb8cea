package node

import (
	"fmt"
	"strings"
	"time"

	"github.com/quotad/quotad/cache"
	"github.com/quotad/quotad/topkeys"
)

// This file is the node's configuration.

// Config is a node's configuration. Build it with defaults, apply overrides,
// then Validate (New does).
type Config struct {
	// KeyPrefix starts every Redis key's hash tag, {prefix:policy:key}
	// (keys.go has the whole layout). Default "quotad". It must not contain
	// '{' or '}'.
	KeyPrefix string
	// Policies are the configured policies; names are unique.
	Policies []Policy
	// DefaultFailureMode applies to policies whose OnStoreError is
	// FailDefault. Default FailOpen.
	DefaultFailureMode FailureMode
	// Lease sizes leases (remote stores only).
	Lease LeaseConfig
	// DeniedCache sizes the hot denied-key cache (remote stores only).
	DeniedCache cache.DeniedConfig
	// Breaker configures the circuit breaker in front of a remote store.
	Breaker BreakerConfig
	// Telemetry is where the node sends traces and metrics; the zero value
	// sends none.
	Telemetry Telemetry
	// TopKeys sizes the tracker of the keys denied most (TopDenied); the
	// zero value takes package topkeys' defaults.
	TopKeys topkeys.Config
	// StoreStateCheck is how often the node asks a remote store whether it
	// lost or replaced its state (the Redis store: a new run_id, a missing
	// marker key), and then drops its leases and cached denials; it also
	// asks whenever the store becomes available again. Default 1s.
	StoreStateCheck time.Duration
	// Cluster is this node's cluster membership (package node/cluster);
	// nil runs standalone. New requires a remote store with it
	// (ErrSharedStoreRequired), announces the store's denials and this
	// node's resets through it, and applies the other members'. Once New
	// succeeds the node owns it and Close leaves the cluster; when New
	// fails, the caller still owns it.
	Cluster Cluster
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return fmt.Errorf("key_prefix: %w: %q must not contain '{' or '}'", ErrInvalidConfig, c.KeyPrefix)
	}
	switch c.DefaultFailureMode {
	case FailDefault, FailOpen, FailClosed:
	default:
		return fmt.Errorf("default failure mode: %w %d", ErrInvalidFailureMode, int(c.DefaultFailureMode))
	}
	if err := c.Lease.withDefaults().Validate(); err != nil {
		return err
	}
	if err := c.Breaker.Validate(); err != nil {
		return err
	}
	if c.StoreStateCheck < 0 {
		return fmt.Errorf("store state check: %w: %s must not be negative (0 means the default)", ErrInvalidConfig, c.StoreStateCheck)
	}
	if err := c.DeniedCache.Validate(); err != nil {
		return fmt.Errorf("denied cache: %w", err)
	}
	if err := c.TopKeys.Validate(); err != nil {
		return fmt.Errorf("top keys: %w", err)
	}
	seen := make(map[string]bool, len(c.Policies))
	for i, p := range c.Policies {
		// A policy NewPolicy built is not validated again.
		if _, err := p.validated(); err != nil {
			return fmt.Errorf("policies[%d] (%s): %w", i, p.Name, err)
		}
		if seen[p.Name] {
			return fmt.Errorf("policies[%d]: %w %q", i, ErrDuplicatePolicy, p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.KeyPrefix == "" {
		c.KeyPrefix = "quotad"
	}
	if c.DefaultFailureMode == FailDefault {
		c.DefaultFailureMode = FailOpen
	}
	c.Lease = c.Lease.withDefaults()
	if c.StoreStateCheck == 0 {
		c.StoreStateCheck = DefaultStoreStateCheck
	}
	return c
}
