// Package node is one quotad member: the check path from a policy and key to
// a decision, the stores that hold the authoritative counters (Redis and the
// embedded memory store), and what the node does when the store fails.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/quotad/quotad/algorithms"
)

// Config is a node's configuration. Build it with defaults, apply overrides,
// then Validate (New does).
type Config struct {
	// KeyPrefix starts every Redis key: {prefix:policy:key}. Default
	// "quotad". It must not contain '{' or '}'.
	KeyPrefix string
	// Policies are the configured policies; names are unique.
	Policies []Policy
	// DefaultFailureMode applies to policies whose OnStoreError is
	// FailDefault. Default FailOpen.
	DefaultFailureMode FailureMode
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
	seen := make(map[string]bool, len(c.Policies))
	for i, p := range c.Policies {
		if err := p.Validate(); err != nil {
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
	return c
}

// Result is a decision and where it came from.
type Result struct {
	algorithms.Decision
	Source Source
}

// Node answers checks. It is safe for concurrent use.
type Node struct {
	cfg      Config
	store    Store
	log      *slog.Logger
	policies map[string]Policy
}

// New returns a node deciding with store. The node owns store from now on
// and closes it in Close. log may be nil (discard).
func New(cfg Config, store Store, log *slog.Logger) (*Node, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("%w: no store", ErrInvalidConfig)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Node{cfg: cfg, store: store, log: log, policies: make(map[string]Policy, len(cfg.Policies))}
	for _, p := range cfg.Policies {
		// Resolve the default now so that status pages and ListPolicies
		// show the mode that applies.
		if p.OnStoreError == FailDefault {
			p.OnStoreError = cfg.DefaultFailureMode
		}
		n.policies[p.Name] = p
	}
	return n, nil
}

// Policy returns the configured policy called name.
func (n *Node) Policy(name string) (Policy, bool) {
	p, ok := n.policies[name]
	return p, ok
}

// Policies returns the configured policies sorted by name.
func (n *Node) Policies() []Policy {
	out := make([]Policy, 0, len(n.policies))
	for _, p := range n.policies {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Store describes the store the node decides with.
func (n *Node) Store() string { return n.store.Describe() }

// Check decides whether key may spend cost units of policy p now, and spends
// them if so. p may be a configured policy or an inline one. Invalid input
// (policy, key, limit, cost) returns an error wrapping one of this package's
// or package algorithms' sentinels, naming the field. A store failure is not
// an error: the policy's failure mode decides, marked in Result.Source. The
// only other errors are the caller's context ending.
//
// It may block on the store until ctx is done or the store's timeout passes.
func (n *Node) Check(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	if err := p.Validate(); err != nil {
		return Result{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Result{}, err
	}
	if err := p.Limit.ValidateCost(cost); err != nil {
		return Result{}, err
	}
	d, err := n.store.Check(ctx, n.keyBase(p.Name, key), p.Limit, cost)
	if err == nil {
		return Result{Decision: d, Source: SourceStore}, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return Result{}, fmt.Errorf("check %s: %w", p.Name, ctxErr)
	}
	return n.storeFailed(p, err), nil
}

// storeFailed turns a store error into the policy's failure-mode decision.
func (n *Node) storeFailed(p Policy, err error) Result {
	mode := p.OnStoreError
	if mode == FailDefault {
		mode = n.cfg.DefaultFailureMode
	}
	n.log.Warn("store check failed", "policy", p.Name, "failure_mode", mode.String(), "err", err)
	capacity := p.Limit.Capacity()
	if mode == FailOpen {
		return Result{Decision: algorithms.Decision{Allowed: true, Limit: capacity, Remaining: capacity}, Source: SourceFailOpen}
	}
	// Nothing is known about when the store will answer; one period is the
	// honest upper bound on when the quota would have been restored.
	return Result{Decision: algorithms.Decision{Allowed: false, Limit: capacity, RetryAfter: p.Limit.Period, ResetAfter: p.Limit.Period}, Source: SourceFailClosed}
}

// Reset forgets the authority's state for key under the policy or inline
// namespace called policy.
func (n *Node) Reset(ctx context.Context, policy, key string) error {
	if err := ValidatePolicyName(policy); err != nil {
		return err
	}
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := n.store.Reset(ctx, n.keyBase(policy, key)); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("reset %s: %w", policy, ctxErr)
		}
		return fmt.Errorf("reset %s: %w: %v", policy, ErrStore, err)
	}
	return nil
}

// keyBase is the Redis key base of one limit: {prefix:policy:key}. The braces
// are a Redis Cluster hash tag, so every key of the limit lands in one slot.
// Policy names cannot contain ':', so distinct (policy, key) pairs never
// share a base.
func (n *Node) keyBase(policy, key string) string {
	var b strings.Builder
	b.Grow(len(n.cfg.KeyPrefix) + len(policy) + len(key) + 4)
	b.WriteByte('{')
	b.WriteString(n.cfg.KeyPrefix)
	b.WriteByte(':')
	b.WriteString(policy)
	b.WriteByte(':')
	b.WriteString(key)
	b.WriteByte('}')
	return b.String()
}

// Close releases the node's store.
func (n *Node) Close() error {
	if err := n.store.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

// IsInvalidInput reports whether err is a problem with the caller's input
// rather than with the node or the store.
func IsInvalidInput(err error) bool {
	for _, s := range []error{
		ErrInvalidPolicyName, ErrInvalidKey, ErrInvalidFailureMode,
		algorithms.ErrUnknownAlgorithm, algorithms.ErrInvalidLimit, algorithms.ErrInvalidPeriod,
		algorithms.ErrInvalidBurst, algorithms.ErrInvalidCost, algorithms.ErrTooLarge,
	} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
