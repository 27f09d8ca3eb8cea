package node

import (
	"context"

	"github.com/quotad/quotad/algorithms"
)

// Store is the authority for limits: Redis through Lua scripts, or the
// embedded memory store. Implementations are safe for concurrent use.
type Store interface {
	// Check decides whether cost units of l fit for the limit stored under
	// base (a key base with a Redis hash tag, see Node.keyBase) and spends
	// them if so. l and cost must be valid. It may block on the network until
	// ctx is done; an error means nothing is known about the decision.
	Check(ctx context.Context, base string, l algorithms.Limit, cost int64) (algorithms.Decision, error)
	// Reset forgets every algorithm's state stored under base.
	Reset(ctx context.Context, base string) error
	// Describe says what the store is, for logs and status pages, e.g.
	// "memory" or "redis 127.0.0.1:6379 db 0". It never includes secrets.
	Describe() string
	// Close releases the store's resources. It is called once.
	Close() error
}
