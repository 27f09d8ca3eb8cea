package node

import "context"

// A bulk call is a store call made for one item of a batch (CheckBatch):
// its caller waits for the whole batch, while a single check's caller
// waits for that one call. A store may keep the two apart so that a big
// batch never holds back single checks. The Redis store does: bulk calls
// go through a pipeline of their own (node/store/redis), so that a single
// check never waits for a round trip full of a batch's items to come
// back, nor goes in one.

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
