package node

import (
	"context"
	"errors"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// This file is what the node asks of its store: the Store interface, the
// optional ones a store may implement, ErrStoreFull and ErrOverloaded.

// Store is the authority for limits: Redis through Lua scripts, or the
// embedded memory store. Implementations are safe for concurrent use.
type Store interface {
	// SlotStore holds concurrency limits' slots (slots.go); Acquire and
	// Release are never called with a concurrency limit.
	SlotStore
	// Acquire decides whether r.Cost units of r.Limit fit for the limit
	// stored under r.Base and, if so, spends between r.Cost and r.Want
	// units, reporting the extra as a grant to be spent within r.Hold
	// (AcquireRequest). r must be valid. It may block on the network until
	// ctx is done; an error means nothing is known about the decision,
	// except ErrStoreFull, which means nothing was spent. An error wrapping
	// ErrOverloaded says that the call did not fail for the store's sake:
	// the node did not get to it in time.
	Acquire(ctx context.Context, r AcquireRequest) (algorithms.Decision, algorithms.Grant, error)
	// Release gives back up to units unused units of grant g and reports
	// how many made a difference. Each grant's units may be given back at
	// most once (the sliding log can tell; the other algorithms cannot).
	Release(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error)
	// Remote reports whether calls cross the network to a store other
	// nodes may share. New reads it once, to compose the node: a remote
	// store gets a circuit breaker and the local layer of leases and
	// remembered denials in front of it, and may serve a cluster; a store
	// that is not remote gets neither.
	Remote() bool
	// Ping reports whether the store answers, without touching any limit.
	// The circuit breaker probes with it while open, so it should pass on
	// a store that is slow but alive: it may take longer than one call
	// (time to open a connection), and may ready connections for the
	// calls that follow.
	Ping(ctx context.Context) error
	// Reset forgets every algorithm's state stored under base.
	Reset(ctx context.Context, base string) error
	// ResetInline forgets every algorithm's state of every inline limit
	// stored under family: the bases family + variant (keys.go). It may
	// have to look through every key the store holds, and block on the
	// network until ctx is done.
	ResetInline(ctx context.Context, family string) error
	// Describe says what the store is, for logs and status pages, e.g.
	// "memory" or "redis 127.0.0.1:6379 db 0". It never includes secrets.
	Describe() string
	// Close releases the store's resources. It is called once.
	Close() error
}

// AcquireRequest is one Store.Acquire call: what it decides, and how the
// call is made.
type AcquireRequest struct {
	// Base is the key base the limit is stored under: a Redis hash tag,
	// the family, maybe followed by an inline limit's variant (keys.go).
	Base string
	// Limit is the limit decided; it must be valid, and not a concurrency
	// limit (SlotStore).
	Limit algorithms.Limit
	// Cost is the units the check spends, Want the units spent if they
	// fit (cost ≤ want ≤ capacity), the extra granted as a lease to be
	// spent within Hold (docs/algorithms.md, "Leases"). A plain check has
	// Want = Cost and Hold = 0.
	Cost, Want int64
	Hold       time.Duration
	// Bulk marks a call made for one item of a batch (a CheckBatch): its
	// caller waits for the whole batch, while a single check's caller
	// waits for that one call. A store may keep the two apart so that a
	// big batch never holds back single checks. The Redis store does: bulk
	// calls go through a pipeline of their own, so that a single check
	// never waits for a round trip full of a batch's items to come back,
	// nor goes in one.
	Bulk bool
	// Charge counts Cost even when it does not fit (CheckOptions.Charge):
	// the call is decided as algorithms.State.Charge, and Cost may be up
	// to Limit.MaxCharge, above the capacity. A cost that fits is admitted,
	// and may take a lease, as without it.
	Charge bool
	// Late, if not nil, is given what a call took when it failed before
	// the store's reply came (its deadline passed, or ctx ended) and the
	// reply comes later: a store that can tell calls it once, on a
	// goroutine of its own, with the grant the reply says was taken, if it
	// took any units. A store that cannot tell (the memory store answers at
	// once) never calls it. (late.go gives it back.)
	Late func(taken algorithms.Grant)
}

// ErrStoreFull means a store holds as many keys as it may (the memory
// store's memory.Config.MaxKeys) and refused to add another. Keys it already
// holds are still decided. It is not a store failure (the failure mode does
// not apply: failing open would stop limiting new keys), and retrying after
// the full keys' states expire may succeed.
var ErrStoreFull = errors.New("memory store full")

// ErrOverloaded means that a store call's deadline passed inside the node
// while the store was answering: the call waited behind others to be sent,
// or its reply came while the node was too busy to read it. It is the
// node's failure, not the store's: the circuit breaker does not count it,
// and the failure mode does not apply (an overloaded node that failed
// open would stop limiting, one that failed closed would deny every key,
// for as long as it stays overloaded). The check is shed instead: the
// caller gets this error, handled by its own failure handling, and may
// retry after a backoff or on another node. The call may still have
// spent at the store, as after any timeout.
var ErrOverloaded = errors.New("node overloaded")

// defaultCallTimeout is how long a check waits for other checks' store
// calls on its key when the store does not say (callTimeouter): the Redis
// store's default call timeout.
const defaultCallTimeout = 50 * time.Millisecond

// callTimeouter is a store that bounds each call as its caller sees it, as
// the Redis store does with its Config.Timeout. A check waits that long at
// most for other checks' calls on its key before making its own (see
// Node.refill); a remote store that does not say gets defaultCallTimeout.
type callTimeouter interface {
	CallTimeout() time.Duration
}

// InstrumentedStore is a store that traces or measures its own calls:
// the Redis store's calls become client spans and db.client metrics, the
// memory store reports how full it is. New calls Instrument once, before
// the node's first call, with its Telemetry; the store's instruments share
// the node's instrumentation scope (Telemetry.Tracer, Telemetry.Meter).
// The calls a circuit breaker refuses never reach the store: the node
// counts them itself (quotad.breaker.refusals).
type InstrumentedStore interface {
	Store
	// Instrument makes the store trace and measure its calls with t (it
	// does nothing with neither a tracer nor a meter in t). The store
	// stops reporting when it closes.
	Instrument(t Telemetry) error
}
