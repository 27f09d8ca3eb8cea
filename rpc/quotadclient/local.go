package quotadclient

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/leases"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// Local mode: checks of a key that is hot in this process are answered
// from a client-side lease, units quotad granted this client ahead of time
// (AcquireLease) and already spent at its authority; a denial quotad gave
// is remembered until its retry_after; the other checks go to quotad,
// concurrent ones together in one CheckBatch (batch.go). The lease rules
// are quotad's own (node/lease.go): a lease is sized by the key's demand
// over a horizon, quotad caps it and says how long it may be spent, and
// the unused units go back when it expires and on Close. The README's
// "Local mode" states the guarantees.

// The sources of decisions made in the client's process.
const (
	// SourceClientLease: units of a lease this client holds.
	SourceClientLease Source = "client_lease"
	// SourceClientDeniedCache: a denial quotad gave this client earlier
	// that still holds.
	SourceClientDeniedCache Source = "client_denied_cache"
)

// LocalOptions turns on local mode (Options.Local). The zero value is the
// default.
type LocalOptions struct {
	// Horizon sizes leases: a lease asks for about the key's demand in this
	// process over this long (quotad caps it). Default 200ms, as quotad's
	// own --lease-horizon.
	Horizon time.Duration
	// BatchWindow is the longest a check that goes to quotad waits for
	// others to share its CheckBatch. A check is sent at once when no
	// batch is in flight, and otherwise with the checks that arrive until
	// the batch in flight returns, BatchMax of them gather, or BatchWindow
	// passes. Default 1ms; negative sends every check alone.
	BatchWindow time.Duration
	// BatchMax is the most checks in one CheckBatch, 1 to 1000; keep it
	// within quotad's --max-batch. Default 100.
	BatchMax int
	// MaxKeys bounds the keys tracked in the lease table: the keys checked
	// in about the last second. Checks of other keys go to quotad, without
	// a lease. Default 10,000.
	MaxKeys int
}

func (o LocalOptions) withDefaults() LocalOptions {
	if o.Horizon == 0 {
		o.Horizon = 200 * time.Millisecond
	}
	if o.BatchWindow == 0 {
		o.BatchWindow = time.Millisecond
	}
	if o.BatchMax == 0 {
		o.BatchMax = 100
	}
	if o.MaxKeys == 0 {
		o.MaxKeys = 10_000
	}
	return o
}

func (o LocalOptions) validate() error {
	switch {
	case o.Horizon < 0:
		return fmt.Errorf("%w: local horizon %v must not be negative", ErrInvalidOptions, o.Horizon)
	case o.BatchWindow > time.Second:
		return fmt.Errorf("%w: local batch window %v exceeds 1s", ErrInvalidOptions, o.BatchWindow)
	case o.BatchMax < 0 || o.BatchMax > 1000:
		return fmt.Errorf("%w: local batch max %d must be 1 to 1000 (0 means 100)", ErrInvalidOptions, o.BatchMax)
	case o.MaxKeys < 0:
		return fmt.Errorf("%w: local max keys %d must not be negative (0 means 10,000)", ErrInvalidOptions, o.MaxKeys)
	}
	return nil
}

// LocalStats are a client's local-mode counters.
type LocalStats struct {
	// LeaseHits and DeniedHits count checks answered in this process.
	LeaseHits, DeniedHits int64
	// Leases counts AcquireLease calls, Granted those that brought units;
	// UnitsLeased and UnitsReturned count units taken and given back
	// (as quotad acknowledged them).
	Leases, Granted, UnitsLeased, UnitsReturned int64
	// Remote counts checks sent to quotad with Check or CheckBatch, and
	// Batches the CheckBatch calls among them.
	Remote, Batches int64
	// UnitsHeld is the unspent units of the leases in force now, plus
	// those on their way back.
	UnitsHeld int64
}

// LocalStats returns the client's local-mode counters; zero without local
// mode.
func (c *Client) LocalStats() LocalStats {
	if c.local == nil {
		return LocalStats{}
	}
	s := &c.local.stats
	return LocalStats{
		LeaseHits: s.leaseHits.Load(), DeniedHits: s.deniedHits.Load(),
		Leases: s.leases.Load(), Granted: s.granted.Load(), UnitsLeased: s.unitsLeased.Load(), UnitsReturned: s.unitsReturned.Load(),
		Remote: c.local.batch.remote.Load(), Batches: c.local.batch.batches.Load(),
		UnitsHeld: c.local.unitsHeld(),
	}
}

// unitsHeld is LocalStats.UnitsHeld.
func (m *local) unitsHeld() int64 {
	held := m.stats.returning.Load()
	now := m.clock()
	m.table.Each(func(_ leaseKey, e *entry) {
		for _, g := range [...]*grant{e.prev.Load(), e.cur.Load()} {
			if g != nil && now < g.ExpiresAt {
				held += g.Unspent()
			}
		}
	})
	return held
}

// returnTimeout bounds each ReturnLease call.
const returnTimeout = 2 * time.Second

// refillTimeout bounds a lease call made ahead of need (refillAhead),
// which no check waits for when it starts.
const refillTimeout = 10 * time.Second

// refillLead is how many round trips of the key's demand a lease keeps in
// hand: when its units fall below that, the next lease is asked for in the
// background, so that hot checks do not wait for it.
const refillLead = 2

// local is a client's local mode.
type local struct {
	svc   serviceClient
	opts  LocalOptions
	table *leases.Table[leaseKey, entry]
	batch *batcher
	stats struct {
		leaseHits, deniedHits                       atomic.Int64
		leases, granted, unitsLeased, unitsReturned atomic.Int64
		returning                                   atomic.Int64
	}
	// unsupported is set when quotad does not know AcquireLease (an older
	// server): every check then goes to quotad.
	unsupported atomic.Bool
	// rtt is the smoothed duration of AcquireLease calls (ns), which sizes
	// the lead of refills ahead of need.
	rtt     atomic.Int64
	epoch   time.Time
	stop    context.CancelFunc
	done    chan struct{}
	returns sync.WaitGroup
	// refills counts lease calls made ahead of need that are in flight;
	// Close waits for them, so that it returns what they bring.
	refills sync.WaitGroup
}

// serviceClient is the part of the generated client local mode uses.
type serviceClient interface {
	Check(context.Context, *connect.Request[quotadv1.CheckRequest]) (*connect.Response[quotadv1.CheckResponse], error)
	CheckBatch(context.Context, *connect.Request[quotadv1.CheckBatchRequest]) (*connect.Response[quotadv1.CheckBatchResponse], error)
	AcquireLease(context.Context, *connect.Request[quotadv1.AcquireLeaseRequest]) (*connect.Response[quotadv1.AcquireLeaseResponse], error)
	ReturnLease(context.Context, *connect.Request[quotadv1.ReturnLeaseRequest]) (*connect.Response[quotadv1.ReturnLeaseResponse], error)
}

func newLocal(svc serviceClient, opts LocalOptions) *local {
	ctx, stop := context.WithCancel(context.Background())
	m := &local{
		svc: svc, opts: opts, table: leases.NewTable[leaseKey, entry](opts.MaxKeys),
		batch: newBatcher(svc, opts.BatchWindow, opts.BatchMax),
		epoch: time.Now(), stop: stop, done: make(chan struct{}),
	}
	go m.janitor(ctx)
	return m
}

// clock is monotonic nanoseconds since the client started.
func (m *local) clock() int64 { return int64(time.Since(m.epoch)) }

// entry returns k's entry, adding one first seen at now if there is room;
// a full table (LocalOptions.MaxKeys) gives an entry that is not in it,
// which never leases (its demand is one check).
func (m *local) entry(k leaseKey, now int64) *entry {
	e, inTable := m.table.GetOrCreate(k, func() *entry {
		e := &entry{}
		e.demand.Start(now)
		return e
	})
	if !inTable {
		e.noLease = true
	}
	return e
}

// leaseKey names a limit of one key: the policy (or inline namespace) and
// its inline limit (zero for a configured policy).
type leaseKey struct {
	policy, key string
	limit       algorithms.Limit
}

// ShardKey is what the lease table shards leaseKeys by.
func (k leaseKey) ShardKey() string { return k.key }

// entry is one key's local state.
type entry struct {
	// cur is the grant being spent; nil before the first. prev is the grant
	// a refill ahead of need replaced, whose last units are spent first
	// until it runs out or expires; nil for none.
	cur, prev atomic.Pointer[grant]
	// denial is the last denial quotad gave, remembered until it ends.
	denial atomic.Pointer[denial]
	// demand is the key's demand in this process and its last use; Asked
	// and LastUsed are counted on the hit path, Rate read with mu held.
	demand leases.Demand

	mu sync.Mutex // guards the fields below; never taken on a hit
	// acquiring is the AcquireLease in flight for the key, if any.
	acquiring *flight
	// leasable is set once quotad answered an AcquireLease for the key (it
	// is not a concurrency limit, whose denials must not be remembered);
	// noLease once it refused one as invalid.
	leasable, noLease bool
	refusedUntil      int64 // clock (ns) before which no lease is asked for
	// refusals counts the lease calls in a row that brought no units; each
	// doubles the wait before the next (refuse).
	refusals int
}

// grant is units of one lease, spent as a node spends its own
// (leases.Units, on the client's clock). Everything but the units, closed
// and ahead is fixed.
type grant struct {
	leases.Units
	// closed is set by whoever ends the grant for good, and it alone gives
	// the unused units back (finish), so two returns never race: the
	// second would find the lease gone at quotad and its units lost.
	closed atomic.Bool
	// ahead is set when a check took the units below low and asked for
	// the next lease in the background; once per grant.
	ahead atomic.Bool
	low   int64
	id    string
}

// denial is a denial of cost units that holds until until (clock ns).
type denial struct {
	cost         int64
	since, until int64
	decision     Decision
}

// flight is an AcquireLease in flight, which checks of the key wait for.
type flight struct {
	done chan struct{}
	err  error // set before done is closed
}

// answer decides a check of cost from e alone: its grants (the one a
// refill replaced first), or its last denial. refill says that the check
// took the current grant below its low mark: the caller should ask for the
// next lease in the background (refillAhead). It allocates nothing.
func (m *local) answer(e *entry, cost, now int64) (d Decision, ok, refill bool) {
	if cost < 0 {
		return Decision{}, false, false // quotad says why
	}
	if g := e.prev.Load(); g != nil {
		if d, _, ok := m.spend(g, cost, now); ok {
			return d, true, false
		}
	}
	if g := e.cur.Load(); g != nil {
		if d, left, ok := m.spend(g, cost, now); ok {
			refill = left < g.low && !g.ahead.Load() && g.ahead.CompareAndSwap(false, true)
			return d, true, refill
		}
	}
	if dn := e.denial.Load(); dn != nil && dn.cost == max(cost, 1) && now < dn.until {
		d := dn.decision
		d.Decision = leases.Countdown(d.Decision, dn.since, dn.until, now)
		d.Source = SourceClientDeniedCache
		m.stats.deniedHits.Add(1)
		return d, true, false
	}
	return Decision{}, false, false
}

// spend takes cost units of g for a check at now, if it holds them and has
// not expired, and reports the units left. The decision's Remaining is
// quotad's remaining at the grant plus those, capped at the capacity.
func (m *local) spend(g *grant, cost, now int64) (d Decision, left int64, ok bool) {
	ad, left, ok := g.Spend(cost, now, m.clock)
	if !ok {
		return Decision{}, 0, false
	}
	m.stats.leaseHits.Add(1)
	return Decision{Decision: ad, Source: SourceClientLease}, left, true
}

// check is Client.Check and CheckLimit in local mode; inline says whether
// k.limit is an inline limit.
func (m *local) check(ctx context.Context, k leaseKey, inline bool, cost int64) (Decision, error) {
	now := m.clock()
	e := m.table.Get(k)
	if e != nil {
		e.demand.Asked.Add(max(cost, 1))
		if now-e.demand.LastUsed.Load() > int64(time.Millisecond) {
			e.demand.LastUsed.Store(now)
		}
		if d, ok, refill := m.answer(e, cost, now); ok {
			if refill {
				m.refillAhead(k, e, inline, cost)
			}
			return d, nil
		}
	} else {
		e = m.entry(k, now)
		e.demand.Asked.Add(max(cost, 1))
	}
	return m.miss(ctx, k, e, inline, cost)
}

// miss decides a check the lease and the remembered denial could not: it
// waits for a lease call in flight for the key and tries its grant, takes a
// new lease if the key is hot, or sends the check to quotad.
func (m *local) miss(ctx context.Context, k leaseKey, e *entry, inline bool, cost int64) (Decision, error) {
	e.mu.Lock()
	for e.acquiring != nil {
		f := e.acquiring
		e.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return Decision{}, fmt.Errorf("check of policy %q: %w", k.policy, ctxError(ctx))
		}
		if d, ok, refill := m.answer(e, cost, m.clock()); ok {
			if refill {
				m.refillAhead(k, e, inline, cost)
			}
			return d, nil
		}
		if f.err != nil {
			// quotad did not answer the lease call: neither would it answer
			// this check now.
			return Decision{}, f.err
		}
		e.mu.Lock()
	}
	want := m.leaseWant(e, cost, m.clock())
	if want == 0 {
		e.mu.Unlock()
		return m.remote(ctx, k, e, inline, cost)
	}
	f := &flight{done: make(chan struct{})}
	e.acquiring = f
	e.mu.Unlock()

	d, err, fallback := m.acquire(ctx, k, e, inline, cost, want, false)
	m.land(e, f, err, fallback)
	if fallback {
		return m.remote(ctx, k, e, inline, cost)
	}
	return d, err
}

// land ends the lease call f of e: checks waiting for it go on, with its
// error unless the check must go to quotad as a plain check (fallback).
func (m *local) land(e *entry, f *flight, err error, fallback bool) {
	e.mu.Lock()
	e.acquiring = nil
	if !fallback {
		f.err = err
	}
	e.mu.Unlock()
	close(f.done)
}
