package node

import "context"

// A bulk call is a store call made for one item of a batch (CheckBatch):
// its caller waits for the whole batch, while a single check's caller
// waits for that one call. A store may keep the two apart so that a big
// batch never holds back single checks. The Redis store does: bulk calls
// go through a pipeline of their own (node/store/redis), so that a single
// check never waits for a round trip full of a batch's items to come
// back, nor goes in one.

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

// bulkKey is the context key of WithBulk.
type bulkKey struct{}

// WithBulk returns ctx marked as bulk: the store calls made under it are
// for a batch's items.
func WithBulk(ctx context.Context) context.Context {
	return context.WithValue(ctx, bulkKey{}, true)
}

// IsBulk reports whether ctx was marked by WithBulk.
func IsBulk(ctx context.Context) bool {
	return ctx.Value(bulkKey{}) != nil
}
