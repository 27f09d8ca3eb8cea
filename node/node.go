package node

// This file is the Node: New, which composes it from its store and
// cluster, and the check path from a policy and key to a decision.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/topkeys"
)

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
	cfg   Config
	store Store
	// keeper is the store, when it keeps some algorithms only
	// (AlgorithmStore); nil when it keeps every one.
	keeper AlgorithmStore
	// resetter is the store before any wrapper, for Reset (resetStore).
	resetter Store
	cluster  Cluster
	log      *slog.Logger

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
	// history is the last minutes of the node's rates (History).
	history history

	// breaker guards a remote store (store is then a breakerStore around
	// it); nil for the memory store.
	breaker     *breaker
	stopBreaker context.CancelFunc
	// coalesceFor is the longest a check waits for other checks' store
	// calls on its key before making its own: the store's call timeout.
	coalesceFor time.Duration

	// stopIntervals ends the goroutine that advances topDenied's
	// intervals and samples the history; intervalsDone is closed once it
	// has.
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
	keeper, _ := store.(AlgorithmStore)
	if err := keepsAll(keeper, cfg.Policies); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	topDenied, err := topkeys.New(cfg.TopKeys)
	if err != nil {
		return nil, fmt.Errorf("top keys: %w", err)
	}
	n := &Node{
		cfg: cfg, store: store, keeper: keeper, resetter: store, cluster: standalone{}, log: log,
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
	if o, ok := store.(InstrumentedStore); ok {
		if err = o.Instrument(cfg.Telemetry); err != nil {
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
	// The history's baseline is taken now, before any check, so that its
	// samples add up to every decision since the node started.
	n.sampleHistory(time.Now())
	go n.advanceIntervals(ctx)
	return n, nil
}

// advanceIntervals starts a new interval of the top denied keys every
// TopDeniedInterval and samples the history every HistoryStep, until ctx
// ends.
func (n *Node) advanceIntervals(ctx context.Context) {
	defer close(n.intervalsDone)
	t := time.NewTicker(TopDeniedInterval)
	defer t.Stop()
	sample := time.NewTicker(HistoryStep)
	defer sample.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n.topDenied.Advance()
		case now := <-sample.C:
			n.sampleHistory(now)
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
// key), ErrOverloaded (the node did not get to the store call in time
// while the store answered: the check is shed, not decided) and the
// caller's context ending.
//
// It may block on the store until ctx is done or the store's timeout passes.
//
// At debug level it logs a line per decision (decision_log.go); the check
// pays for one level test when the level is off.
func (n *Node) Check(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	return n.CheckWith(ctx, p, key, cost, CheckOptions{})
}

// CheckWith is Check made as o says: Check is CheckWith with the zero
// CheckOptions, a single check.
func (n *Node) CheckWith(ctx context.Context, p Policy, key string, cost int64, o CheckOptions) (Result, error) {
	if n.log.Enabled(ctx, slog.LevelDebug) {
		return n.checkLogged(ctx, p, key, cost, o)
	}
	return n.checkMeasured(ctx, p, key, cost, o)
}

// checkMeasured is Check without the debug log.
func (n *Node) checkMeasured(ctx context.Context, p Policy, key string, cost int64, o CheckOptions) (Result, error) {
	var res Result
	var err error
	if n.tel.observed() {
		res, err = n.checkObserved(ctx, p, key, cost, o)
	} else {
		res, err = n.check(ctx, p, key, cost, o)
	}
	if err == nil {
		n.count(p.Name, key, res)
	}
	return res, err
}

// check is Check without telemetry.
func (n *Node) check(ctx context.Context, p Policy, key string, cost int64, o CheckOptions) (Result, error) {
	p, err := n.validatedFor(p)
	if err != nil {
		return Result{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Result{}, err
	}
	if o.Charge {
		if err := p.Limit.ValidateCharge(cost); err != nil {
			return Result{}, err
		}
	} else if err := p.Limit.ValidateCost(cost); err != nil {
		return Result{}, err
	}
	if p.Limit.Algorithm == algorithms.Concurrency {
		// Never leased nor answered from the denied cache (slots.go).
		return n.checkSlot(ctx, p, key, cost)
	}
	return n.local.check(ctx, p, key, cost, o)
}

// storeFailed logs a failed store call and returns the policy's
// failure-mode decision, or, for a call the node did not get to in time,
// the error the check is shed with (failureOf).
func (n *Node) storeFailed(p Policy, err error) (Result, error) {
	// While the breaker is open every check lands here; it logged once.
	// An overloaded node sheds many checks a second: they are counted
	// (Stats.StoreOverloads), not logged one by one.
	if !errors.Is(err, ErrBreakerOpen) && !errors.Is(err, ErrOverloaded) {
		n.log.Warn("store check failed", "policy", p.Name, "failure_mode", n.failureModeOf(p).String(), "err", err)
	}
	return n.failureOf(p, err)
}

// failureOf is what a check of p answers when its store call failed with
// err: the policy's failure-mode decision, unless err wraps ErrOverloaded,
// for which it returns that error: the store was answering, so the
// failure mode has nothing to stand in for, and taking it would turn the
// node's overload into admissions (open) or denials (closed) of every key.
func (n *Node) failureOf(p Policy, err error) (Result, error) {
	if errors.Is(err, ErrOverloaded) {
		return Result{}, fmt.Errorf("check %s: %w", p.Name, err)
	}
	return n.failureResult(p), nil
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
	p, configured := n.policies.Load().Policy(policy)
	err := n.resetStore(ctx, family, p, configured)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("reset %s: %w", policy, ctxErr)
		}
		if errors.Is(err, ErrResetUnsupported) {
			return fmt.Errorf("reset %s: %w", policy, err)
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
	// Leave once the leases are back (the shutdown order the README
	// describes): until then this node still counts in its peers' lease
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
// rather than with the node or the store: whether it wraps
// ErrInvalidInput, as every input error of this package and of package
// algorithms does.
func IsInvalidInput(err error) bool { return errors.Is(err, ErrInvalidInput) }
