package quotadclient

import (
	"context"
	"fmt"
	"math"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/leases"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// This file is local mode's calls to quotad: leases taken ahead of need
// or on a miss, refusals, the round trip, remembered denials and the
// plain remote check.

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
// horizon (leases.Demand, as a node's), or 0 when a lease is not
// worthwhile (a cold key, a key quotad refused lately or cannot lease).
// quotad caps what it grants. e.mu held.
func (m *local) leaseWant(e *entry, cost, now int64) int64 {
	if e.noLease || m.unsupported.Load() || now < e.refusedUntil || cost <= 0 {
		return 0
	}
	return e.demand.Want(now, m.opts.Horizon, cost, math.MaxInt64)
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
		req.PreviousLeaseId, req.PreviousKept = old.id, max(1, old.Unspent())
	case old.closed.CompareAndSwap(false, true):
		// Spent or expired: its leftovers go back in the same call, before
		// the new grant is sized, so quotad's cap counts only the new one.
		// If the call fails, they are lost until the window or refill
		// restores them. Closing it first means the janitor gives nothing
		// back for it (a second return of the same lease would find it
		// gone at quotad, and lose its units).
		req.PreviousLeaseId, req.PreviousUnits = old.id, old.Claim()
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
			Units: leases.Units{
				ExpiresAt:     sent + int64(msg.GetUseWithin().AsDuration()),
				Capacity:      d.Limit,
				AuthRemaining: d.Remaining - units,
				ResetAt:       sent + int64(d.ResetAfter),
			},
			id: msg.GetLeaseId(),
		}
		// The next lease is asked for when what is left would last about
		// refillLead round trips at the demand this one was sized for (want
		// units over a horizon); at least a few checks' worth, at most half
		// the grant.
		lead := float64(refillLead*m.rtt.Load()) / float64(m.opts.Horizon)
		g.low = min(max(int64(float64(want)*lead), leases.MinChecks*cost), units/2)
		g.Fill(units)
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
