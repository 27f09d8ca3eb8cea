package quotadclient

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
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
	m.table.each(func(e *entry) {
		for _, g := range [...]*grant{e.prev.Load(), e.cur.Load()} {
			if g != nil && now < g.expiresAt {
				held += g.units.Load()
			}
		}
	})
	return held
}

// minLeaseChecks is the smallest lease worth asking for, in checks of the
// asking cost, as quotad's own: a lease costs a call to take and often one
// to give back.
const minLeaseChecks = 4

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
	table *leaseTable
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
		svc: svc, opts: opts, table: newLeaseTable(opts.MaxKeys),
		batch: newBatcher(svc, opts.BatchWindow, opts.BatchMax),
		epoch: time.Now(), stop: stop, done: make(chan struct{}),
	}
	go m.janitor(ctx)
	return m
}

// clock is monotonic nanoseconds since the client started.
func (m *local) clock() int64 { return int64(time.Since(m.epoch)) }

// leaseKey names a limit of one key: the policy (or inline namespace) and
// its inline limit (zero for a configured policy).
type leaseKey struct {
	policy, key string
	limit       algorithms.Limit
}

// entry is one key's local state.
type entry struct {
	// cur is the grant being spent; nil before the first. prev is the grant
	// a refill ahead of need replaced, whose last units are spent first
	// until it runs out or expires; nil for none.
	cur, prev atomic.Pointer[grant]
	// denial is the last denial quotad gave, remembered until it ends.
	denial   atomic.Pointer[denial]
	demand   atomic.Int64 // units asked for since sampleStart
	lastUsed atomic.Int64 // clock (ns) of a recent check

	mu sync.Mutex // guards the fields below; never taken on a hit
	// acquiring is the AcquireLease in flight for the key, if any.
	acquiring   *flight
	sampleStart int64
	rate        float64 // units per second, smoothed
	// leasable is set once quotad answered an AcquireLease for the key (it
	// is not a concurrency limit, whose denials must not be remembered);
	// noLease once it refused one as invalid.
	leasable, noLease bool
	refusedUntil      int64 // clock (ns) before which no lease is asked for
	// refusals counts the lease calls in a row that brought no units; each
	// doubles the wait before the next (refuse).
	refusals int
}

// grant is units of one lease. Everything but units, closed and ahead is
// fixed.
type grant struct {
	units atomic.Int64
	// closed is set by whoever ends the grant for good, and it alone gives
	// the unused units back (finish), so two returns never race: the
	// second would find the lease gone at quotad and its units lost.
	closed atomic.Bool
	// ahead is set when a check took the units below low and asked for
	// the next lease in the background; once per grant.
	ahead     atomic.Bool
	low       int64
	expiresAt int64 // clock (ns) from which no unit may be spent
	id        string
	capacity  int64
	// authRemaining and resetAt are quotad's answer at the grant, for the
	// estimate a hit reports.
	authRemaining, resetAt int64
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
		d.RetryAfter = ceilMillis(time.Duration(dn.until - now))
		d.ResetAfter = max(ceilMillis(d.ResetAfter-time.Duration(now-dn.since)), d.RetryAfter)
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
	need := max(cost, 1)
	for {
		u := g.units.Load()
		if u < need || now >= g.expiresAt {
			return Decision{}, 0, false
		}
		if !g.units.CompareAndSwap(u, u-cost) {
			continue
		}
		// As quotad's nodes do: units claimed just as the grant expired are
		// dropped, not spent late.
		if now = m.clock(); now >= g.expiresAt {
			return Decision{}, 0, false
		}
		m.stats.leaseHits.Add(1)
		return Decision{Decision: algorithms.Decision{
			Allowed:    true,
			Limit:      g.capacity,
			Remaining:  min(g.capacity, g.authRemaining+u-cost),
			ResetAfter: time.Duration(max(0, g.resetAt-now)),
		}, Source: SourceClientLease}, u - cost, true
	}
}

// ceilMillis rounds d up to a whole millisecond, as quotad reports.
func ceilMillis(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		d += time.Millisecond - r
	}
	return d
}

// check is Client.Check and CheckLimit in local mode; inline says whether
// k.limit is an inline limit.
func (m *local) check(ctx context.Context, k leaseKey, inline bool, cost int64) (Decision, error) {
	now := m.clock()
	e := m.table.get(k)
	if e != nil {
		e.demand.Add(max(cost, 1))
		if now-e.lastUsed.Load() > int64(time.Millisecond) {
			e.lastUsed.Store(now)
		}
		if d, ok, refill := m.answer(e, cost, now); ok {
			if refill {
				m.refillAhead(k, e, inline, cost)
			}
			return d, nil
		}
	} else {
		e = m.table.getOrCreate(k, now)
		e.demand.Add(max(cost, 1))
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

// refillAhead asks for k's next lease in the background, while the current
// one still has a few units: a check that took it below its low mark (a
// couple of round trips of the key's demand) calls this, so hot checks go
// on spending instead of waiting for the call. At most one lease call per
// key is in flight; checks that run out meanwhile wait for it, as for any.
//
// The call decides a check of cost like any lease call (quotad spends a
// lease only with a check), and an allowed one's units join the new grant.
// The current grant is retired, not returned: quotad no longer counts it
// against the cap, and it is spent first until it runs out or expires,
// when its last units go back.
func (m *local) refillAhead(k leaseKey, e *entry, inline bool, cost int64) {
	e.mu.Lock()
	want := int64(0)
	if e.acquiring == nil {
		want = m.leaseWant(e, cost, m.clock())
	}
	if want == 0 {
		e.mu.Unlock()
		return
	}
	f := &flight{done: make(chan struct{})}
	e.acquiring = f
	e.mu.Unlock()
	m.refills.Add(1)
	go func() {
		defer m.refills.Done()
		ctx, cancel := context.WithTimeout(context.Background(), refillTimeout)
		defer cancel()
		_, err, fallback := m.acquire(ctx, k, e, inline, cost, want, true)
		m.land(e, f, err, fallback)
	}()
}

// leaseWant sizes a lease for a check of cost: the key's demand over the
// horizon, or 0 when a lease is not worthwhile (a cold key, a key quotad
// refused lately or cannot lease). As quotad's own (node/lease.go), demand
// is measured over horizon-long samples and smoothed; until a sample
// completes, the checks seen so far bound the rate from below. e.mu held.
func (m *local) leaseWant(e *entry, cost, now int64) int64 {
	if e.noLease || m.unsupported.Load() || now < e.refusedUntil || cost <= 0 {
		return 0
	}
	horizon := m.opts.Horizon
	demand := e.demand.Load()
	if elapsed := now - e.sampleStart; elapsed >= int64(horizon) {
		e.demand.Add(-demand)
		sample := float64(demand) / (float64(elapsed) / float64(time.Second))
		if e.rate == 0 {
			e.rate = sample
		} else {
			e.rate = 0.5*e.rate + 0.5*sample
		}
		e.sampleStart, demand = now, 0
	}
	rate := max(e.rate, float64(demand)/horizon.Seconds())
	want := int64(rate * horizon.Seconds())
	if want < minLeaseChecks*cost {
		return 0
	}
	return want
}

// acquire asks quotad to decide a check of cost and lease up to want more
// units of k, and installs what comes back: the grant, or the denial.
// fallback says that quotad refused the call as invalid or does not know
// it, so the check must go to quotad as a plain check. ahead says that the
// call is refillAhead's: the check is nobody's, and the current grant is
// retired rather than returned.
func (m *local) acquire(ctx context.Context, k leaseKey, e *entry, inline bool, cost, want int64, ahead bool) (d Decision, err error, fallback bool) {
	req := &quotadv1.AcquireLeaseRequest{Policy: k.policy, Key: k.key, Cost: &cost, Want: want}
	old := e.cur.Load()
	switch {
	case old == nil || old.closed.Load():
	case ahead:
		// Still being spent: quotad keeps it open for the return of what
		// is left when it runs out or expires (finish). The janitor does
		// not finish it while this call is in flight, so that return comes
		// after quotad retired it, never before (which would lose it).
		req.PreviousLeaseId, req.PreviousKept = old.id, max(1, old.units.Load())
	case old.closed.CompareAndSwap(false, true):
		// Spent or expired: its leftovers go back in the same call, before
		// the new grant is sized, so quotad's cap counts only the new one.
		// If the call fails, they are lost until the window or refill
		// restores them. Closing it first means the janitor gives nothing
		// back for it (a second return of the same lease would find it
		// gone at quotad, and lose its units).
		req.PreviousLeaseId, req.PreviousUnits = old.id, old.units.Swap(0)
	}
	if inline {
		req.Limit = limitToProto(k.limit)
	}
	m.stats.leases.Add(1)
	sent := m.clock()
	res, err := m.svc.AcquireLease(ctx, connect.NewRequest(req))
	m.measure(m.clock() - sent)
	if err != nil {
		switch connect.CodeOf(err) {
		case connect.CodeUnimplemented:
			m.unsupported.Store(true)
			return Decision{}, nil, true
		case connect.CodeInvalidArgument:
			// A concurrency limit, or input quotad refuses: a plain check
			// gets the slot, or the error, as without local mode.
			e.mu.Lock()
			e.noLease = true
			e.mu.Unlock()
			return Decision{}, nil, true
		}
		return Decision{}, fmt.Errorf("check of policy %q: %w", k.policy, err), false
	}
	msg := res.Msg
	d = decisionFromProto(msg.GetDecision())
	units := msg.GetUnits()
	extra := units // beyond the check's own cost
	if req.PreviousKept > 0 && d.Allowed && units > 0 {
		// The call's own check is nobody's: quotad counts its cost in the
		// grant. (A quotad that does not know previous_kept leaves it out,
		// and so does one asked without a previous lease, the current one
		// having expired meanwhile: that unit stays spent.)
		extra -= cost
	}
	e.mu.Lock()
	e.leasable = true
	switch {
	case extra == 0 && d.Allowed && d.Remaining-units < cost:
		// The store itself has no more for now: the next check asks again
		// (and is likely denied, and that denial remembered).
		e.refusedUntil = 0
	case extra == 0 && d.Allowed:
		m.refuse(e)
	case extra > 0:
		e.refusals = 0
	}
	e.mu.Unlock()
	if units > 0 {
		m.stats.granted.Add(1)
		m.stats.unitsLeased.Add(units)
		// Measured from before the call was sent: quotad measured from
		// later, so the lease ends here no later than quotad assumes.
		g := &grant{
			expiresAt:     sent + int64(msg.GetUseWithin().AsDuration()),
			id:            msg.GetLeaseId(),
			capacity:      d.Limit,
			authRemaining: d.Remaining - units,
			resetAt:       sent + int64(d.ResetAfter),
		}
		// The next lease is asked for when what is left would last about
		// refillLead round trips at the demand this one was sized for (want
		// units over a horizon); at least a few checks' worth, at most half
		// the grant.
		lead := float64(refillLead*m.rtt.Load()) / float64(m.opts.Horizon)
		g.low = min(max(int64(float64(want)*lead), minLeaseChecks*cost), units/2)
		g.units.Store(units)
		if ahead {
			// The old grant's last units are spent first (answer), and the
			// one it replaced, if still there, is finished now.
			if older := e.prev.Swap(old); older != nil {
				m.finish(older)
			}
		}
		e.cur.Store(g)
	}
	m.remember(e, cost, d, sent)
	return d, nil, false
}

// refuse notes that quotad allowed a lease call's check but granted no
// units while its store had more: a small limit, leases off, or the key's
// share held by others. The key is checked check by check for
// a while, then asked again: a couple of round trips after the first
// refusal in a row, twice as long after each next, up to a horizon. e.mu
// held.
func (m *local) refuse(e *entry) {
	wait := max(time.Millisecond, time.Duration(refillLead*m.rtt.Load())) << min(e.refusals, 16)
	e.refusals++
	e.refusedUntil = m.clock() + int64(min(wait, m.opts.Horizon))
}

// measure folds the duration of a lease call into the smoothed round trip.
func (m *local) measure(took int64) {
	for {
		old := m.rtt.Load()
		next := took
		if old > 0 {
			next = old + (took-old)/8
		}
		if m.rtt.CompareAndSwap(old, next) {
			return
		}
	}
}

// remember keeps a denial quotad gave at sent (clock ns) for a check of
// cost, until its retry_after measured from sent, so never longer than
// quotad meant. Only decisions of quotad's store or its denied cache, and
// only for keys known not to be concurrency limits (whose slots a release
// frees at any moment).
func (m *local) remember(e *entry, cost int64, d Decision, sent int64) {
	if d.Allowed || d.RetryAfter <= 0 || (d.Source != SourceStore && d.Source != SourceDeniedCache) {
		return
	}
	e.mu.Lock()
	ok := e.leasable
	e.mu.Unlock()
	if ok {
		e.denial.Store(&denial{cost: max(cost, 1), since: sent, until: sent + int64(d.RetryAfter), decision: d})
	}
}

// remote sends a check to quotad, batched with concurrent ones.
func (m *local) remote(ctx context.Context, k leaseKey, e *entry, inline bool, cost int64) (Decision, error) {
	req := &quotadv1.CheckRequest{Policy: k.policy, Key: k.key, Cost: &cost}
	if inline {
		req.Limit = limitToProto(k.limit)
	}
	sent := m.clock()
	d, err := m.batch.check(ctx, req)
	if err != nil {
		return Decision{}, fmt.Errorf("check of policy %q: %w", k.policy, err)
	}
	m.remember(e, cost, d, sent)
	return d, nil
}

// finish ends g for good, if nobody has yet, and gives its unused units
// back to quotad in the background.
func (m *local) finish(g *grant) {
	if !g.closed.CompareAndSwap(false, true) {
		return
	}
	if left := g.units.Swap(0); left > 0 {
		m.giveBack(g, left)
	}
}

// giveBack returns left units of g to quotad in the background.
func (m *local) giveBack(g *grant, left int64) {
	m.returns.Add(1)
	m.stats.returning.Add(left)
	go func() {
		defer m.returns.Done()
		defer m.stats.returning.Add(-left)
		ctx, cancel := context.WithTimeout(context.Background(), returnTimeout)
		defer cancel()
		res, err := m.svc.ReturnLease(ctx, connect.NewRequest(&quotadv1.ReturnLeaseRequest{LeaseId: g.id, Units: left}))
		if err == nil {
			m.stats.unitsReturned.Add(res.Msg.GetReturned())
		}
		// A failed return only leaves the units spent until the window or
		// refill restores them.
	}()
}

// janitor returns the unused units of expired leases and forgets idle
// keys until ctx ends.
func (m *local) janitor(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	idle := int64(max(time.Second, 4*m.opts.Horizon))
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := m.clock()
		m.table.sweep(func(e *entry) bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.acquiring != nil {
				// The call in flight retires or returns the current grant
				// (acquire), and installs the next: this round leaves e be.
				return false
			}
			if p := e.prev.Load(); p != nil && (now >= p.expiresAt || p.units.Load() == 0) {
				// Run out: the new grant is spent now.
				e.prev.CompareAndSwap(p, nil)
				m.finish(p)
			}
			g := e.cur.Load()
			if g != nil && now >= g.expiresAt {
				m.finish(g)
			}
			return (g == nil || now >= g.expiresAt) && e.prev.Load() == nil && now-e.lastUsed.Load() > idle
		})
	}
}

// close stops the janitor, ends every lease and returns its unused units,
// waiting for the returns until ctx ends.
func (m *local) close(ctx context.Context) error {
	m.stop()
	<-m.done
	// Grants that refills in flight bring are returned too.
	refilled := make(chan struct{})
	go func() { m.refills.Wait(); close(refilled) }()
	select {
	case <-refilled:
	case <-ctx.Done():
		return fmt.Errorf("returning leases: %w", ctx.Err())
	}
	m.table.sweep(func(e *entry) bool {
		for _, g := range [...]*grant{e.prev.Load(), e.cur.Load()} {
			if g != nil {
				m.finish(g)
			}
		}
		return false
	})
	done := make(chan struct{})
	go func() { m.returns.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("returning leases: %w", ctx.Err())
	}
}

// ctxError is ctx's error with its Connect code, as a call that ended with
// ctx would have returned it.
func ctxError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}

// leaseTable holds the entries, sharded; lookups allocate nothing.
type leaseTable struct {
	seed   maphash.Seed
	shards [32]leaseShard
	size   atomic.Int64
	max    int64
}

type leaseShard struct {
	mu sync.RWMutex
	m  map[leaseKey]*entry
}

func newLeaseTable(maxKeys int) *leaseTable {
	t := &leaseTable{seed: maphash.MakeSeed(), max: int64(maxKeys)}
	for i := range t.shards {
		t.shards[i].m = make(map[leaseKey]*entry)
	}
	return t
}

func (t *leaseTable) shard(k leaseKey) *leaseShard {
	return &t.shards[maphash.String(t.seed, k.key)%uint64(len(t.shards))]
}

func (t *leaseTable) get(k leaseKey) *entry {
	sh := t.shard(k)
	sh.mu.RLock()
	e := sh.m[k]
	sh.mu.RUnlock()
	return e
}

// getOrCreate returns k's entry, adding one if there is room; a full table
// gives an entry that is not in it, which never leases (its demand is one
// check).
func (t *leaseTable) getOrCreate(k leaseKey, now int64) *entry {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[k]; e != nil {
		return e
	}
	e := &entry{sampleStart: now}
	e.lastUsed.Store(now)
	if t.size.Add(1) > t.max {
		t.size.Add(-1)
		e.noLease = true
		return e
	}
	sh.m[k] = e
	return e
}

// each calls f on every entry under read locks.
func (t *leaseTable) each(f func(*entry)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for _, e := range sh.m {
			f(e)
		}
		sh.mu.RUnlock()
	}
}

// sweep calls f on every entry under its shard's write lock and removes
// those for which it returns true; f must not block for long.
func (t *leaseTable) sweep(f func(*entry) bool) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if f(e) {
				delete(sh.m, k)
				t.size.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}
