package node

// This file is how a check is made beside what it decides (CheckOptions),
// and the bounds on a batch's concurrent checks.

// CheckOptions say how a check (CheckWith) or a batch (CheckAllWith) is
// made, beside what it decides. The zero value is a single check's.
type CheckOptions struct {
	// Bulk marks the checks as items of a batch (a CheckBatch): their
	// caller waits for the whole batch, while a single check's caller
	// waits for that one check. Their store calls carry it
	// (AcquireRequest.Bulk), so that a store may keep them apart from
	// single checks'. The Redis store does: bulk calls go through a
	// pipeline of their own (node/store/redis), so that a single check
	// never waits for a round trip full of a batch's items to come back,
	// nor goes in one.
	Bulk bool
	// Charge counts the cost even when it does not fit, as
	// envoyproxy/ratelimit's counters do (its fixed window is an INCRBY):
	// the key goes over its limit, owing a debt, and later checks are
	// denied until the window ends or the refill pays it back
	// (algorithms.State.Charge; docs/algorithms.md, "Charges"). Every rate
	// algorithm charges; a concurrency limit refuses it
	// (algorithms.ErrCannotCharge), and so does CheckAllWith. Any cost from
	// 0 to the limit's MaxCharge is taken, even above the capacity. A
	// charge that fits is admitted as a plain check is, from the key's
	// lease or at the store (where it may take a lease: the lease's units
	// are counted when taken). A remembered denial never answers a charge:
	// it goes to the store, to be counted. One that is denied empties the
	// key's lease on this node: its units were counted, and the key owes
	// more than they would cover.
	Charge bool
}

// BatchParallel bounds the checks of one batch decided at once: the items
// of a plain CheckBatch (rpc) and the groups of a CheckAll asked together.
// The node pipelines concurrent store calls for different keys (one round
// trip for many) and coalesces those for one key, so a batch of cold keys
// costs a few round trips rather than one per item, with no more than
// this many goroutines waiting on them, however long the batch.
const BatchParallel = 64

// BatchSpawnChunk is how many of a batch's workers start before the
// starting goroutine yields its processor. Started all in one go,
// BatchParallel workers would fill the run queue, and whatever became
// ready after them (a single check's request) would wait for all of them
// to run up to their first store call. A chunk at a time, with a yield
// between, lets it run in between; the workers' store calls still queue up
// together for the round trips in flight.
const BatchSpawnChunk = 8
