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
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
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
	// Lease sizes leases (remote stores only).
	Lease LeaseConfig
	// DeniedCache sizes the hot denied-key cache (remote stores only).
	DeniedCache cache.DeniedConfig
	// Breaker configures the circuit breaker in front of a remote store.
	Breaker BreakerConfig
	// ClusterSize reports how many nodes share the store, for lease caps;
	// nil means Cluster's size, or 1 without one. It is called on the miss
	// path and must be cheap.
	ClusterSize func() int
	// Telemetry is where the node sends traces and metrics; the zero value
	// sends none.
	Telemetry Telemetry
	// Cluster is this node's cluster membership; nil runs standalone. New
	// requires a remote store with it (ErrSharedStoreRequired), gossips the
	// store's denials and this node's resets through it, and applies the
	// peers'. Once New succeeds the node owns it and Close leaves the
	// cluster; when New fails, the caller still owns it.
	Cluster *Membership
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
	if err := c.DeniedCache.Validate(); err != nil {
		return fmt.Errorf("denied cache: %w", err)
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
	c.Lease = c.Lease.withDefaults()
	if c.ClusterSize == nil && c.Cluster != nil {
		c.ClusterSize = c.Cluster.Size
	}
	if c.ClusterSize == nil {
		c.ClusterSize = func() int { return 1 }
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
	cfg         Config
	lcfg        LeaseConfig
	store       Store
	log         *slog.Logger
	policies    map[string]Policy
	clusterSize func() int

	// Local pre-aggregation, used only with a remote store: in process, the
	// memory store is as fast as a lease.
	leases *leaseTable
	denied *cache.Denied
	stats  stats
	tel    *telemetry
	// looks shares all-or-nothing batches' reads (batch.go).
	looks lookFlights

	// breaker guards a remote store (store is then a breakerStore around
	// it); nil for the memory store.
	breaker     *breaker
	stopBreaker context.CancelFunc

	stopJanitor context.CancelFunc
	janitorDone chan struct{}
	closed      atomic.Bool

	// epoch anchors the node clock: leases and remembered denials measure
	// time as the monotonic nanoseconds since it, so a step of the wall
	// clock (NTP, a resumed VM) never stretches a lease or a denial.
	epoch time.Time
}

// clock is the node clock: monotonic nanoseconds since the node started.
func (n *Node) clock() int64 { return int64(time.Since(n.epoch)) }

// stats are the node's lease and cache counters.
type stats struct {
	leasesGranted, unitsLeased, unitsReturned, denialsCached atomic.Int64
	leaseHits, deniedCacheHits                               atomic.Int64
}

// Stats is a snapshot of the node's local pre-aggregation.
type Stats struct {
	// LeasesGranted counts grants of more than the checking request's cost.
	LeasesGranted int64
	// UnitsLeased counts units taken in leases beyond the granting checks'
	// own cost; UnitsReturned counts those given back unused.
	UnitsLeased, UnitsReturned int64
	// UnitsHeld is the units this node's leases hold right now.
	UnitsHeld int64
	// DenialsCached counts store denials remembered for later checks.
	DenialsCached int64
	// LeaseHits and DeniedCacheHits count checks answered locally.
	LeaseHits, DeniedCacheHits int64
	// Denied is the denied cache's own counters.
	Denied cache.DeniedStats
	// StoreErrors counts failed store calls (not those the breaker
	// refused); BreakerOpens counts how often the breaker opened, and
	// BreakerOpen says whether it is open now.
	StoreErrors, BreakerOpens int64
	BreakerOpen               bool
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	st := Stats{
		LeasesGranted:   n.stats.leasesGranted.Load(),
		UnitsLeased:     n.stats.unitsLeased.Load(),
		UnitsReturned:   n.stats.unitsReturned.Load(),
		UnitsHeld:       n.unitsHeld(),
		DenialsCached:   n.stats.denialsCached.Load(),
		LeaseHits:       n.stats.leaseHits.Load(),
		DeniedCacheHits: n.stats.deniedCacheHits.Load(),
		Denied:          n.denied.Stats(),
	}
	if n.breaker != nil {
		st.StoreErrors = n.breaker.errors.Load()
		st.BreakerOpens = n.breaker.opens.Load()
		st.BreakerOpen = n.breaker.open.Load()
	}
	return st
}

// StoreAvailable reports whether checks reach the store: false while the
// circuit breaker is open. The memory store is always available.
func (n *Node) StoreAvailable() bool { return n.breaker == nil || !n.breaker.open.Load() }

// OnStoreAvailability registers fn to be called each time the store becomes
// unavailable (the breaker opens) or available again. fn runs on the node's
// goroutine that saw the change and must not block.
func (n *Node) OnStoreAvailability(fn func(available bool)) {
	if n.breaker != nil {
		n.breaker.onChange(fn)
	}
}

// DefaultFailureMode is the failure mode of inline limits and of policies
// that set none.
func (n *Node) DefaultFailureMode() FailureMode { return n.cfg.DefaultFailureMode }

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
	denied, err := cache.NewDenied(cfg.DeniedCache)
	if err != nil {
		return nil, fmt.Errorf("denied cache: %w", err)
	}
	n := &Node{
		cfg: cfg, lcfg: cfg.Lease, store: store, log: log, clusterSize: cfg.ClusterSize,
		policies: make(map[string]Policy, len(cfg.Policies)),
		leases:   newLeaseTable(),
		denied:   denied,
		epoch:    time.Now(),
	}
	for _, p := range cfg.Policies {
		// Resolve the default now so that status pages and ListPolicies
		// show the mode that applies.
		if p.OnStoreError == FailDefault {
			p.OnStoreError = cfg.DefaultFailureMode
		}
		n.policies[p.Name] = p
	}
	if n.tel, err = newTelemetry(cfg.Telemetry, n, store); err != nil {
		denied.Close()
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if cfg.Cluster != nil {
		if err := n.attachCluster(cfg.Cluster); err != nil {
			n.tel.close()
			denied.Close()
			return nil, err
		}
	}
	if store.Remote() {
		ctx, cancel := context.WithCancel(context.Background())
		n.breaker, n.stopBreaker = newBreaker(ctx, cfg.Breaker, store.Ping, log), cancel
		n.store = breakerStore{Store: store, b: n.breaker}
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stopJanitor, n.janitorDone = cancel, make(chan struct{})
	go n.janitor(ctx)
	return n, nil
}

// janitor returns the unused units of expired leases and forgets idle
// keys, until ctx ends.
func (n *Node) janitor(ctx context.Context) {
	defer close(n.janitorDone)
	if !n.store.Remote() {
		return
	}
	t := time.NewTicker(n.lcfg.Hold / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A key that needs a lease is checked every few milliseconds
			// (its rate × horizon must reach minLeaseChecks), so one idle for a
			// second has nothing worth keeping; its denial, if any, lives
			// on in the denied cache.
			n.sweepLeases(ctx, max(time.Second, 4*n.lcfg.Hold))
		}
	}
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
	if n.tel.observed() {
		return n.checkObserved(ctx, p, key, cost)
	}
	return n.check(ctx, p, key, cost)
}

// check is Check without telemetry.
func (n *Node) check(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	if err := p.Validate(); err != nil {
		return Result{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Result{}, err
	}
	if err := p.Limit.ValidateCost(cost); err != nil {
		return Result{}, err
	}
	if n.store.Remote() {
		return n.checkLeased(ctx, p, key, cost)
	}
	d, _, err := n.acquire(ctx, n.keyBase(p.Name, key), p.Limit, cost, cost, 0)
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
	// While the breaker is open every check lands here; it logged once.
	if !errors.Is(err, ErrStoreUnavailable) {
		n.log.Warn("store check failed", "policy", p.Name, "failure_mode", mode.String(), "err", err)
	}
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
	// Local state goes first, so no lease or cached denial survives the
	// authority's reset.
	n.forgetLocal(policy, key)
	// Forget again once the authority is reset, and wait for the cache to
	// apply it: a denial added just before may become visible after the
	// first Forget.
	defer func() {
		n.denied.Forget(cache.Key{Policy: policy, Key: key})
		n.denied.Wait()
	}()
	if err := n.store.Reset(ctx, n.keyBase(policy, key)); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("reset %s: %w", policy, ctxErr)
		}
		return fmt.Errorf("reset %s: %w: %v", policy, ErrStore, err)
	}
	n.gossipReset(policy, key)
	return nil
}

// forgetLocal drops this node's lease and remembered denials of key.
// Units held in the lease are not returned: the authority forgets them
// anyway.
func (n *Node) forgetLocal(policy, key string) {
	if l := n.leases.remove(leaseKey{policy, key}); l != nil {
		// A store call in flight for l must not install its grant or denial
		// (fetch checks dead under l.mu), and checks still holding l must
		// not spend pre-reset units.
		l.mu.Lock()
		l.dead = true
		l.mu.Unlock()
		if g := l.cur.Swap(nil); g != nil {
			g.units.Store(0)
		}
		l.denial.Store(nil)
	}
	n.denied.Forget(cache.Key{Policy: policy, Key: key})
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

// cacheKey is the denied cache's name for a key under lim.
func (n *Node) cacheKey(k leaseKey, lim algorithms.Limit) cache.Key {
	return cache.Key{Policy: k.policy, Key: k.key, Limit: lim}
}

// Close returns the unused units of every lease to the store, leaves the
// cluster, if any, then closes the store. Checks must have stopped. Calls
// after the first return nil.
func (n *Node) Close() error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	n.stopJanitor()
	<-n.janitorDone
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n.releaseAll(ctx)
	// Leave once the leases are back (the shutdown order of the issue and
	// the README): until then this node still counts in its peers' lease
	// caps, which only keeps theirs a little smaller for a moment.
	if err := n.cfg.Cluster.Close(); err != nil {
		n.log.Warn("leaving the cluster", "err", err)
	}
	if n.breaker != nil {
		n.stopBreaker()
		n.breaker.wait()
	}
	n.denied.Close()
	n.tel.close()
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
