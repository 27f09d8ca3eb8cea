package node

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// This file decides several checks as one, all or nothing, over the Store
// interface: it takes each check's cost from the store in a fixed order and,
// when one does not fit, gives back what the others took before answering.
// The rules, and what a concurrent observer sees, are the README's "All or
// nothing" and docs/algorithms.md, "All or nothing: giving back".

// Item is one check of CheckAll: may Key spend Cost units of Policy?
type Item struct {
	// Policy is a configured policy or an inline one, as for Check.
	Policy Policy
	// Key is what is limited, as for Check.
	Key string
	// Cost is the units to spend, 0 to the limit's capacity; 0 spends
	// nothing and asks whether one unit would be admitted.
	Cost int64
}

// ItemError is CheckAll's error for an invalid item: its index in the
// items and the problem, which wraps the sentinel Check would return.
type ItemError struct {
	Index int
	Err   error
}

func (e *ItemError) Error() string { return fmt.Sprintf("item %d: %v", e.Index, e.Err) }

func (e *ItemError) Unwrap() error { return e.Err }

// ErrConcurrencyInBatch is CheckAll's error for an item of a concurrency
// limit: its slots are checked with Check, renewed and released one by one.
var ErrConcurrencyInBatch = algorithms.NewInputError("a concurrency limit cannot be part of an all-or-nothing batch; check it with Check")

// batchCallTimeout bounds each store call of a CheckAll, which runs on
// even when no caller waits for it any more; the store's own per-call
// deadline normally ends each call much sooner.
const batchCallTimeout = 10 * time.Second

// CheckAll decides items as one: either every item is allowed and spends
// its cost, or none spends anything. It returns one Result per item, in
// order:
//
//   - Allowed is the batch's outcome, the same for every item: true only if
//     every item fitted (a cost-0 item fits when one unit would be admitted;
//     a store failure fits when the item's policy fails open).
//   - RetryAfter is above zero exactly for the items that did not fit on
//     their own: the reason for a denial. Items of a denied batch that did
//     fit have RetryAfter 0, and report Remaining as after the units they
//     took were given back.
//   - Items naming the same policy (limit, failure mode and lease mode
//     included) and key are one check of their summed cost, and share its
//     Result.
//
// Items are taken from the store one after another in a fixed order (by
// key, the same on every node), so that two batches over the same limits
// never deny each other with units that are then given back; cost-0 items
// are asked first, all at once. The first item that does not fit stops the
// taking: the items taken so far are given back, and the items not reached
// are only looked at (a cost-0 check), all at once, before CheckAll
// returns. While a batch runs, the units it took are spent at the store,
// and a concurrent check may be denied for them; once it has answered,
// a denied batch has spent nothing, as far as each algorithm can give units
// back (docs/algorithms.md); a take whose reply came after its deadline
// (the item took its failure mode, or the batch was shed) is given back
// when the reply comes, unless the batch was answered allowed. A
// remembered denial of any item denies the batch without a store call.
// Leases are neither used nor taken: every item is decided by the store.
// Cost-0 items are asked on at most BatchParallel goroutines.
//
// An invalid item, or items of one policy and key whose costs add up to
// more than the limit can ever admit, fail the call with an *ItemError
// naming the first such item; nothing is decided. The only other errors
// are the caller's context ending, and ErrOverloaded, when the node did
// not get to an item's store call in time while the store answered (the
// batch is shed rather than answered by that item's failure mode): the
// batch then stops taking, gives back what it took, and spends nothing.
// It may block on the store until ctx is done.
func (n *Node) CheckAll(ctx context.Context, items []Item) ([]Result, error) {
	return n.CheckAllWith(ctx, items, CheckOptions{})
}

// CheckAllWith is CheckAll made as o says: CheckAll is CheckAllWith with
// the zero CheckOptions.
func (n *Node) CheckAllWith(ctx context.Context, items []Item, o CheckOptions) ([]Result, error) {
	if o.Charge {
		return nil, fmt.Errorf("charge: %w: a charge counts even what does not fit, so it cannot be all or nothing; charge each item (CheckWith)", ErrInvalidInput)
	}
	b, err := n.newBatch(items)
	if err != nil {
		return nil, err
	}
	b.opts = o
	// The batch runs to its end on its own goroutine, like a lease refill:
	// only a batch that runs to completion knows what it took, and so can
	// give it back.
	out := make(chan []Result)
	abandon := make(chan struct{})
	go func() {
		bctx := context.WithoutCancel(ctx)
		b.decide(bctx, abandon)
		var res []Result
		if b.shed == nil {
			res = b.results(len(items))
		}
		allowed := false
		select {
		case out <- res:
			allowed = b.shed == nil && !b.denied
		case <-abandon:
			// The caller got an error; it must not have spent anything.
			b.giveBack(bctx)
		}
		b.settleLate(allowed)
	}()
	select {
	case res := <-out:
		if b.shed != nil {
			return nil, fmt.Errorf("check all: %w", b.shed)
		}
		n.countBatch(b, res)
		return res, nil
	case <-ctx.Done():
		close(abandon)
		return nil, fmt.Errorf("check all: %w", ctx.Err())
	}
}

// batch is one CheckAll: its items grouped by limit and key, in the order
// they are taken.
type batch struct {
	n      *Node
	groups []*batchGroup
	// opts are the options of the CheckAllWith the batch decides.
	opts CheckOptions
	// denied is set once an item did not fit (or the caller left).
	denied bool
	// shed is the first group's shed, once decide has returned: the batch
	// fails with it.
	shed error
}

// batchGroup is the items of one policy and key: one check of their summed
// cost.
type batchGroup struct {
	p     Policy
	key   string
	base  string
	cost  int64
	items []int // indices into the caller's items

	state groupState
	res   Result
	// taken is what the store spent for the group; Units > 0 until it is
	// given back.
	taken algorithms.Grant
	// returned is how many of the taken units made a difference when given
	// back.
	returned int64
	// shed is set (wrapping ErrOverloaded) when the group's store call was
	// not made in time: the group is undecided, and the batch fails.
	shed error
	// late settles what the group's take took if its reply came after
	// the call had failed (late.go); nil before the take.
	late *lateTake
}

// groupState is how far a group got.
type groupState int

const (
	// groupUnreached: not decided; looked at if the batch is denied.
	groupUnreached groupState = iota
	// groupFits: decided, and it fits (taken, asked with cost 0, or failed
	// open).
	groupFits
	// groupRefused: it does not fit (or failed closed): the batch is denied.
	groupRefused
	// groupLooked: not decided, looked at with cost 0 once the batch was
	// denied.
	groupLooked
)

// newBatch validates items and groups them in the order they are taken:
// cost-0 groups first, then by key base and limit.
func (n *Node) newBatch(items []Item) (*batch, error) {
	type groupKey struct {
		p   Policy
		key string
	}
	byKey := make(map[groupKey]*batchGroup, len(items))
	b := &batch{n: n, groups: make([]*batchGroup, 0, len(items))}
	for i, it := range items {
		var err error
		// Every policy marked validated, so that a literal and its
		// configured twin fall in one group.
		if it.Policy, err = n.validatedFor(it.Policy); err != nil {
			return nil, &ItemError{Index: i, Err: err}
		}
		if err := ValidateKey(it.Key); err != nil {
			return nil, &ItemError{Index: i, Err: err}
		}
		if it.Policy.Limit.Algorithm == algorithms.Concurrency {
			// A batch gives back what it took through Store.Release, and a
			// slot is not units: refused rather than left held.
			return nil, &ItemError{Index: i, Err: fmt.Errorf("policy %s: %w", it.Policy.Name, ErrConcurrencyInBatch)}
		}
		if err := it.Policy.Limit.ValidateCost(it.Cost); err != nil {
			return nil, &ItemError{Index: i, Err: err}
		}
		k := groupKey{it.Policy, it.Key}
		g := byKey[k]
		if g == nil {
			g = &batchGroup{p: it.Policy, key: it.Key, base: n.keyBase(it.Policy, it.Key)}
			byKey[k] = g
			b.groups = append(b.groups, g)
		}
		g.cost += it.Cost
		g.items = append(g.items, i)
		if c := it.Policy.Limit.Capacity(); g.cost > c {
			return nil, &ItemError{Index: i, Err: fmt.Errorf("cost: %w: with the earlier checks of policy %s and this key, %d in all exceeds what the limit can ever admit (%d)",
				algorithms.ErrInvalidCost, it.Policy.Name, g.cost, c)}
		}
	}
	slices.SortFunc(b.groups, func(x, y *batchGroup) int {
		if (x.cost == 0) != (y.cost == 0) {
			if x.cost == 0 {
				return -1
			}
			return 1
		}
		return cmp.Or(
			cmp.Compare(x.base, y.base),
			cmp.Compare(x.p.Limit.Algorithm, y.p.Limit.Algorithm),
			cmp.Compare(x.p.Limit.Limit, y.p.Limit.Limit),
			cmp.Compare(x.p.Limit.Period, y.p.Limit.Period),
			cmp.Compare(x.p.Limit.Burst, y.p.Limit.Burst),
			cmp.Compare(x.p.OnStoreError, y.p.OnStoreError),
			cmp.Compare(x.p.Lease, y.p.Lease),
		)
	})
	return b, nil
}

// decide runs the batch to its end: remembered denials, then the cost-0
// groups at once, then the others one at a time; on a denial it gives back
// what was taken and looks at the groups not reached. It stops taking once
// abandon is closed.
func (b *batch) decide(ctx context.Context, abandon <-chan struct{}) {
	n := b.n
	now := n.clock()
	for _, g := range b.groups {
		if d, ok := n.local.denied(leaseKey{g.p.Name, g.key}, g.p.Limit, g.cost, now); ok {
			n.stats.deniedCacheHits.Add(1)
			g.refuse(Result{Decision: d, Source: SourceDeniedCache})
			b.denied = true
		}
	}
	if !b.denied {
		first := 0
		for first < len(b.groups) && b.groups[first].cost == 0 {
			first++
		}
		b.each(b.groups[:first], func(g *batchGroup) { b.ask(ctx, g) })
		for _, g := range b.groups[:first] {
			b.denied = b.denied || g.state == groupRefused
			b.noteShed(g)
		}
		for _, g := range b.groups[first:] {
			if b.denied || b.shed != nil {
				break
			}
			select {
			case <-abandon:
				// Nobody will read the answer: stop taking.
				b.denied = true
			default:
				b.ask(ctx, g)
				b.denied = g.state == groupRefused
				b.noteShed(g)
			}
		}
	}
	if b.denied || b.shed != nil {
		// A shed batch answers nothing but its error: the groups not
		// reached need no look.
		b.each(b.groups, func(g *batchGroup) {
			switch g.state {
			case groupFits:
				b.giveBackGroup(ctx, g)
			case groupUnreached:
				if b.shed == nil {
					b.look(ctx, g)
				}
			}
		})
		for _, g := range b.groups {
			b.noteShed(g)
		}
	}
}

// noteShed makes g's shed, if any, the batch's, unless it has one.
func (b *batch) noteShed(g *batchGroup) {
	if b.shed == nil {
		b.shed = g.shed
	}
}

// each calls f for every group in gs, concurrently when there are several
// (the store pipelines concurrent calls into few round trips) on at most
// BatchParallel goroutines, as a plain CheckBatch decides its items, and
// returns once all have returned. A goroutine per group would let one
// caller's batches of a thousand cost-0 items start thousands of
// goroutines, each with a store call that queues inside the node.
func (b *batch) each(gs []*batchGroup, f func(*batchGroup)) {
	if len(gs) == 1 {
		f(gs[0])
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range min(len(gs), BatchParallel) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(gs)); i = next.Add(1) - 1 {
				f(gs[i])
			}
		})
		if w%BatchSpawnChunk == BatchSpawnChunk-1 {
			runtime.Gosched()
		}
	}
	wg.Wait()
}

// ask decides g at the store, spending its cost if it fits.
func (b *batch) ask(ctx context.Context, g *batchGroup) {
	n := b.n
	ctx, cancel := context.WithTimeout(ctx, batchCallTimeout)
	defer cancel()
	start := n.clock()
	g.late = n.newLateTake(leaseKey{g.p.Name, g.key}, g.base, g.p.Limit)
	d, taken, err := n.store.Acquire(ctx, AcquireRequest{Base: g.base, Limit: g.p.Limit, Cost: g.cost, Want: g.cost, Bulk: b.opts.Bulk, Late: g.late.arrived})
	if err != nil {
		// Nothing is known of the item, not even whether it spent; its
		// failure mode decides whether it fits, unless the node did not
		// get to the call in time: then the batch is shed.
		res, shed := n.storeFailed(g.p, err)
		switch {
		case shed != nil:
			g.shed = shed
		case res.Allowed:
			g.fit(res)
		default:
			g.refuse(res)
		}
		return
	}
	res := Result{Decision: d, Source: SourceStore}
	if !d.Allowed {
		b.rememberDenial(g, g.cost, d, start)
		g.refuse(res)
		return
	}
	g.taken = taken
	g.fit(res)
}

// rememberDenial caches the store's denial of cost units of g's limit,
// asked at start (node clock), and gossips it, as a check's would be.
func (b *batch) rememberDenial(g *batchGroup, cost int64, d algorithms.Decision, start int64) {
	b.n.local.remember(leaseKey{g.p.Name, g.key}, nil, g.p.Limit, max(cost, 1), d, start)
}

// giveBackGroup returns the units g took. A failure only costs
// under-admission until the window or refill restores them, so it is
// logged. Units that went back may make room that a remembered denial of
// the key no longer reflects, so that denial is dropped.
func (b *batch) giveBackGroup(ctx context.Context, g *batchGroup) {
	n := b.n
	if g.taken.Units <= 0 {
		return
	}
	units := g.taken.Units
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	returned, err := n.store.Release(rctx, g.base, g.p.Limit, units, g.taken)
	g.taken = algorithms.Grant{}
	if err != nil {
		n.log.Warn("all-or-nothing give-back failed; the units return when the window or refill restores them",
			"policy", g.p.Name, "units", units, "err", err)
		return
	}
	g.returned = returned
	if returned > 0 {
		n.local.returned(leaseKey{g.p.Name, g.key})
	}
}

// settleLate settles each group's late take, if its take failed and its
// reply comes (or came) late: a batch that was answered allowed spent each
// group's cost, any other spent nothing.
func (b *batch) settleLate(allowed bool) {
	for _, g := range b.groups {
		if g.late == nil {
			continue
		}
		keep := int64(0)
		if allowed {
			keep = g.cost
		}
		g.late.settle(keep)
	}
}

// giveBack returns every group's taken units: for a batch whose caller
// left before it answered.
func (b *batch) giveBack(ctx context.Context) {
	b.each(b.groups, func(g *batchGroup) { b.giveBackGroup(ctx, g) })
}

func (g *batchGroup) fit(res Result)    { g.state, g.res = groupFits, res }
func (g *batchGroup) refuse(res Result) { g.state, g.res = groupRefused, res }

// results is the answer for the caller's n items (see CheckAll).
func (b *batch) results(n int) []Result {
	out := make([]Result, n)
	for _, g := range b.groups {
		res := g.res
		if b.denied {
			res.Allowed = false
			switch g.state {
			case groupRefused:
				// Every denial has a wait; the floor keeps "above zero"
				// true whatever a store answers.
				res.RetryAfter = max(res.RetryAfter, time.Millisecond)
			case groupFits:
				res.RetryAfter = 0
				res.Remaining = min(res.Limit, res.Remaining+g.returned)
			case groupLooked:
				if res.Source != SourceStore {
					break // a failure mode's answer
				}
				// The look asked for one unit; the group's own cost fits if
				// that many remain (remaining is the largest cost a check
				// would admit). A larger cost certainly fits once the quota
				// is full again: an upper bound on its wait.
				switch need := max(g.cost, 1); {
				case res.Remaining >= need:
					res.RetryAfter = 0
				case need > 1:
					res.RetryAfter = max(res.RetryAfter, res.ResetAfter, time.Millisecond)
				}
			}
		}
		for _, i := range g.items {
			out[i] = res
		}
	}
	return out
}

// countBatch counts the batch's decisions, one per item, in the node's
// metrics. An item of a denied batch counts among its key's top denials
// only if it did not fit on its own (RetryAfter above zero): one exhausted
// key must not list every key batched with it as limited.
func (n *Node) countBatch(b *batch, res []Result) {
	for _, g := range b.groups {
		for _, i := range g.items {
			n.countLimited(g.p.Name, g.key, res[i], !res[i].Allowed && res[i].RetryAfter > 0)
		}
	}
}
