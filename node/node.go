// Package node is one quotad member: the check path from a policy and key to
// a decision, the stores that hold the authoritative counters (Redis and the
// embedded memory store), and what the node does when the store fails.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
	"github.com/quotad/quotad/topkeys"
)

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
	// ClusterSize reports how many nodes share the store, for lease caps;
	// nil means Cluster's size, or 1 without one. It is called on the miss
	// path and must be cheap.
	ClusterSize func() int
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
	if c.StoreStateCheck == 0 {
		c.StoreStateCheck = DefaultStoreStateCheck
	}
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
	// Slot is the id of the slot an allowed check of cost 1 on a
	// concurrency limit took from the store, to renew and release it
	// (RenewSlot, ReleaseSlot); "" otherwise, and when the store failed
	// and the policy failed open.
	Slot string
}

// Node answers checks. It is safe for concurrent use.
type Node struct {
	cfg         Config
	lcfg        LeaseConfig
	store       Store
	cluster     Cluster
	log         *slog.Logger
	clusterSize func() int

	// policies is the configured policies; SetPolicies swaps in a new set
	// under swapMu.
	policies atomic.Pointer[PolicySet]
	swapMu   sync.Mutex

	// local is what the node keeps in front of its store: leases and
	// remembered denials for a remote store, nothing for the memory store
	// (local.go).
	local local
	stats stats
	tel   *telemetry
	// looks shares all-or-nothing batches' reads (batch.go).
	looks lookFlights

	// decisions counts decisions by policy, outcome and source (Decisions,
	// and quotad.decisions when there is a meter); topDenied tracks the
	// keys denied most (TopDenied).
	decisions policyLabels
	topDenied *topkeys.Tracker

	// breaker guards a remote store (store is then a breakerStore around
	// it); nil for the memory store.
	breaker     *breaker
	stopBreaker context.CancelFunc
	// coalesceFor is the longest a check waits for other checks' store
	// calls on its key before making its own: the store's call timeout.
	coalesceFor time.Duration

	// stopIntervals ends the goroutine that advances topDenied's
	// intervals; intervalsDone is closed once it has.
	stopIntervals context.CancelFunc
	intervalsDone chan struct{}
	closed        atomic.Bool

	// epoch anchors the node clock: leases and remembered denials measure
	// time as the monotonic nanoseconds since it, so a step of the wall
	// clock (NTP, a resumed VM) never stretches a lease or a denial.
	epoch time.Time
}

// clock is the node clock: monotonic nanoseconds since the node started.
func (n *Node) clock() int64 { return int64(time.Since(n.epoch)) }

// millis converts a reading of the node clock (ns) to the denied cache's
// clock: monotonic milliseconds since the node started.
func millis(ns int64) int64 { return ns / int64(time.Millisecond) }

// stats are the node's lease and cache counters.
type stats struct {
	leasesGranted, unitsLeased, unitsReturned, denialsCached atomic.Int64
	leaseHits, deniedCacheHits                               atomic.Int64
	storeStateLosses                                         atomic.Int64
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
	// LeaseKeys is the keys the node tracks for leasing now (at most
	// LeaseConfig.MaxKeys); LeaseTableFull counts checks of other keys
	// that found no room and went to the store without a lease.
	LeaseKeys, LeaseTableFull int64
	// DenialsCached counts store denials remembered for later checks.
	DenialsCached int64
	// LeaseHits and DeniedCacheHits count checks answered locally.
	LeaseHits, DeniedCacheHits int64
	// StoreStateLosses counts the times the store's state changed under
	// the node (a Redis restart, failover or flush) and the node dropped
	// every lease and cached denial.
	StoreStateLosses int64
	// Denied is the denied cache's own counters.
	Denied cache.DeniedStats
	// StoreErrors counts failed store calls (not those the breaker
	// refused); BreakerOpens counts how often the breaker opened, and
	// BreakerOpen says whether it is open now. Breaker says whether there
	// is one: only a remote store has it.
	StoreErrors, BreakerOpens int64
	BreakerOpen, Breaker      bool
	// StoreCalls counts the calls a remote store was sent (checks, lease
	// grants and returns; not resets, nor calls the breaker refused); 0
	// for the memory store. Pipelining may carry several in one round
	// trip.
	StoreCalls int64
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	f := n.local.figures()
	st := Stats{
		LeasesGranted:   n.stats.leasesGranted.Load(),
		UnitsLeased:     n.stats.unitsLeased.Load(),
		UnitsReturned:   n.stats.unitsReturned.Load(),
		UnitsHeld:       f.unitsHeld,
		LeaseKeys:       f.leaseKeys,
		LeaseTableFull:  f.tableFull,
		DenialsCached:   n.stats.denialsCached.Load(),
		LeaseHits:       n.stats.leaseHits.Load(),
		DeniedCacheHits: n.stats.deniedCacheHits.Load(),
		Denied:          f.denied,

		StoreStateLosses: n.stats.storeStateLosses.Load(),
	}
	if n.breaker != nil {
		st.StoreErrors = n.breaker.errors.Load()
		st.BreakerOpens = n.breaker.opens.Load()
		st.BreakerOpen = n.breaker.open.Load()
		st.StoreCalls = n.breaker.calls.Load()
		st.Breaker = true
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
	topDenied, err := topkeys.New(cfg.TopKeys)
	if err != nil {
		return nil, fmt.Errorf("top keys: %w", err)
	}
	n := &Node{
		cfg: cfg, lcfg: cfg.Lease, store: store, cluster: standalone{}, log: log, clusterSize: cfg.ClusterSize,
		topDenied: topDenied,
		epoch:     time.Now(),
	}
	// newPolicySet resolves the default failure mode now, so that status
	// pages and ListPolicies show the mode that applies.
	n.policies.Store(newPolicySet(cfg.Policies, cfg.DefaultFailureMode))
	n.decisions.init(n.Policies())
	n.local = direct{n}
	fail := func(err error) (*Node, error) {
		if n.stopBreaker != nil {
			n.stopBreaker()
		}
		n.local.drain(context.Background())
		n.local.close()
		if n.tel != nil {
			n.tel.close()
		}
		return nil, err
	}
	n.coalesceFor = defaultCallTimeout
	if ct, ok := store.(callTimeouter); ok {
		n.coalesceFor = ct.CallTimeout()
	}
	// The one place that asks what the store is: a remote store gets a
	// circuit breaker and the local layer of leases and remembered
	// denials (leasing.go); the memory store neither (local.go).
	remote := store.Remote()
	if remote {
		ctx, cancel := context.WithCancel(context.Background())
		n.breaker, n.stopBreaker = newBreaker(ctx, cfg.Breaker, store.Ping, log), cancel
		n.store = breakerStore{Store: store, b: n.breaker}
	}
	if o, ok := store.(ObservedStore); ok {
		if n.store, err = o.Observe(n.store, cfg.Telemetry); err != nil {
			return fail(fmt.Errorf("telemetry: %w", err))
		}
	}
	if remote {
		l, err := newLeasing(n, store)
		if err != nil {
			return fail(err)
		}
		n.local = l
	}
	if n.tel, err = newTelemetry(cfg.Telemetry, n); err != nil {
		return fail(fmt.Errorf("telemetry: %w", err))
	}
	if cfg.Cluster != nil {
		if !remote {
			// Every node on its own memory store would admit the whole
			// limit: a cluster of k such nodes admits k times it.
			return fail(fmt.Errorf("cluster: %w: the embedded memory store (%s) is private to each node, so a cluster would admit the limit once per node; configure Redis", ErrSharedStoreRequired, n.store.Describe()))
		}
		if err := cfg.Cluster.Serve(receiver{n}); err != nil {
			return fail(err)
		}
		n.cluster = cfg.Cluster
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stopIntervals, n.intervalsDone = cancel, make(chan struct{})
	go n.advanceIntervals(ctx)
	return n, nil
}

// advanceIntervals starts a new interval of the top denied keys every
// TopDeniedInterval, until ctx ends.
func (n *Node) advanceIntervals(ctx context.Context) {
	defer close(n.intervalsDone)
	t := time.NewTicker(TopDeniedInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.topDenied.Advance()
		}
	}
}

// Policy returns the configured policy called name.
func (n *Node) Policy(name string) (Policy, bool) { return n.policies.Load().Policy(name) }

// Policies returns the configured policies sorted by name.
func (n *Node) Policies() []Policy { return n.policies.Load().All() }

// Store describes the store the node decides with.
func (n *Node) Store() string { return n.store.Describe() }

// Check decides whether key may spend cost units of policy p now, and spends
// them if so. p may be a configured policy or an inline one. Invalid input
// (policy, key, limit, cost) returns an error wrapping one of this package's
// or package algorithms' sentinels, naming the field. A store failure is not
// an error: the policy's failure mode decides, marked in Result.Source. The
// only other errors are ErrStoreFull (a full memory store refusing a new
// key) and the caller's context ending.
//
// It may block on the store until ctx is done or the store's timeout passes.
//
// At debug level it logs a line per decision (decision_log.go); the check
// pays for one level test when the level is off.
func (n *Node) Check(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	if n.log.Enabled(ctx, slog.LevelDebug) {
		return n.checkLogged(ctx, p, key, cost)
	}
	return n.checkMeasured(ctx, p, key, cost)
}

// checkMeasured is Check without the debug log.
func (n *Node) checkMeasured(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	var res Result
	var err error
	if n.tel.observed() {
		res, err = n.checkObserved(ctx, p, key, cost)
	} else {
		res, err = n.check(ctx, p, key, cost)
	}
	if err == nil {
		n.count(p.Name, key, res)
	}
	return res, err
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
	if p.Limit.Algorithm == algorithms.Concurrency {
		// Never leased nor answered from the denied cache (slots.go).
		return n.checkSlot(ctx, p, key, cost)
	}
	return n.local.check(ctx, p, key, cost)
}

// storeFailed logs a failed store call and returns the policy's
// failure-mode decision.
func (n *Node) storeFailed(p Policy, err error) Result {
	// While the breaker is open every check lands here; it logged once.
	if !errors.Is(err, ErrStoreUnavailable) {
		n.log.Warn("store check failed", "policy", p.Name, "failure_mode", n.failureModeOf(p).String(), "err", err)
	}
	return n.failureResult(p)
}

// failureModeOf is the failure mode that applies to p.
func (n *Node) failureModeOf(p Policy) FailureMode {
	if p.OnStoreError == FailDefault {
		return n.cfg.DefaultFailureMode
	}
	return p.OnStoreError
}

// failureResult is p's failure-mode decision: allow or deny, marked.
func (n *Node) failureResult(p Policy) Result {
	mode := n.failureModeOf(p)
	capacity := p.Limit.Capacity()
	if mode == FailOpen {
		return Result{Decision: algorithms.Decision{Allowed: true, Limit: capacity, Remaining: capacity}, Source: SourceFailOpen}
	}
	// Nothing is known about when the store will answer; one period is the
	// honest upper bound on when the quota would have been restored.
	return Result{Decision: algorithms.Decision{Allowed: false, Limit: capacity, RetryAfter: p.Limit.Period, ResetAfter: p.Limit.Period}, Source: SourceFailClosed}
}

// Reset forgets the authority's state for key under the policy or inline
// namespace called policy: under every inline limit the key was checked
// with, too.
func (n *Node) Reset(ctx context.Context, policy, key string) error {
	if err := ValidatePolicyName(policy); err != nil {
		return err
	}
	if err := ValidateKey(key); err != nil {
		return err
	}
	// Local state goes first, so no lease or cached denial survives the
	// authority's reset.
	n.local.forget(policy, key)
	// Forget again once the authority is reset, and wait for the cache to
	// apply it: a denial added just before may become visible after the
	// first Forget.
	defer n.local.forgetAgain(policy, key)
	family := n.keyFamily(policy, key)
	err := n.store.Reset(ctx, family)
	if _, configured := n.policies.Load().Policy(policy); !configured && err == nil {
		// An inline namespace: its limits' states are stored apart.
		err = n.store.ResetInline(ctx, family)
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("reset %s: %w", policy, ctxErr)
		}
		return fmt.Errorf("reset %s: %w: %v", policy, ErrStore, err)
	}
	n.cluster.AnnounceReset(policy, key)
	return nil
}

// Close returns the unused units of every lease to the store, leaves the
// cluster, if any, then closes the store. Checks must have stopped. Calls
// after the first return nil.
func (n *Node) Close() error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	n.stopIntervals()
	<-n.intervalsDone
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n.local.drain(ctx)
	// Leave once the leases are back (the shutdown order of the issue and
	// the README): until then this node still counts in its peers' lease
	// caps, which only keeps theirs a little smaller for a moment.
	if err := n.cluster.Close(); err != nil {
		n.log.Warn("leaving the cluster", "err", err)
	}
	if n.breaker != nil {
		n.stopBreaker()
		n.breaker.wait()
	}
	n.local.close()
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
		ErrInvalidPolicyName, ErrInvalidKey, ErrInvalidFailureMode, ErrInvalidSlot, ErrNotConcurrency, ErrConcurrencyInBatch,
		algorithms.ErrUnknownAlgorithm, algorithms.ErrInvalidLimit, algorithms.ErrInvalidPeriod,
		algorithms.ErrInvalidBurst, algorithms.ErrInvalidCost, algorithms.ErrTooLarge,
	} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
