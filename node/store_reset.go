package node

import (
	"context"
	"errors"

	"github.com/quotad/quotad/algorithms"
)

// This file is what Reset asks of a store whose keys depend on the limit,
// and the error of a reset a store cannot do.

// ErrResetUnsupported means the store cannot do this reset at all, and never
// will (the memcached store cannot list its keys, so it cannot find an
// inline namespace's limits). It is not a failure of the store: retrying
// does not help. rpc answers Unimplemented.
var ErrResetUnsupported = errors.New("this store cannot do this reset")

// LimitResetter is a store whose state of a limit is found only with the
// limit (the memcached store keys each window by its start, which needs
// the period). Reset of a configured policy calls ResetLimit with the
// policy's limit instead of Store.Reset.
type LimitResetter interface {
	Store
	// ResetLimit forgets the state of l stored under base. It may block
	// on the network until ctx is done.
	ResetLimit(ctx context.Context, base string, l algorithms.Limit) error
}

// resetStore is Reset's call to the store for family, the key family of a
// policy or inline namespace; configured is the policy when it is one.
func (n *Node) resetStore(ctx context.Context, family string, configured Policy, isConfigured bool) error {
	if lr, ok := n.resetter.(LimitResetter); ok && isConfigured {
		return lr.ResetLimit(ctx, family, configured.Limit)
	}
	err := n.store.Reset(ctx, family)
	if !isConfigured && err == nil {
		// An inline namespace: its limits' states are stored apart.
		err = n.store.ResetInline(ctx, family)
	}
	return err
}
