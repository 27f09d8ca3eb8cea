package quotadclient

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/rpc/protoconv"
)

// SlotRef names a concurrency slot that a check took: the limit and key
// the check named, and the slot's id (Decision.Slot).
type SlotRef struct {
	// Policy is the configured concurrency policy or, with Limit, the
	// inline limit's namespace.
	Policy string
	// Limit is the inline limit the check used; nil for a configured
	// policy.
	Limit *algorithms.Limit
	Key   string
	ID    string
}

// RenewSlot keeps the slot s alive for another period (the returned
// Decision's SlotExpiresAfter) and reports the limit's state (Limit,
// Remaining). A slot that is not held — never taken, already released, or
// expired because it was not renewed within its period — is an error with
// code NotFound: the slot is gone, and renewing again will not bring it
// back. Other errors are as Check's. It blocks until quotad answers or ctx
// ends.
func (c *Client) RenewSlot(ctx context.Context, s SlotRef) (Decision, error) {
	req := &quotadv1.RenewSlotRequest{Policy: s.Policy, Key: s.Key, SlotId: s.ID, Limit: limitProto(s.Limit)}
	res, err := c.svc.RenewSlot(ctx, connect.NewRequest(req))
	if err != nil {
		return Decision{}, fmt.Errorf("renew of a slot of policy %q: %w", s.Policy, err)
	}
	m := res.Msg
	return Decision{
		Decision:         algorithms.Decision{Allowed: true, Limit: m.GetLimit(), Remaining: m.GetRemaining()},
		Source:           SourceStore,
		Slot:             s.ID,
		SlotExpiresAfter: m.GetExpiresAfter().AsDuration(),
	}, nil
}

// ReleaseSlot frees the slot s and reports the limit's state after it
// (Limit, Remaining). A slot is freed once: releasing it again, or after it
// expired, is an error with code NotFound and frees nothing. Other errors
// are as Check's. It blocks until quotad answers or ctx ends.
func (c *Client) ReleaseSlot(ctx context.Context, s SlotRef) (Decision, error) {
	req := &quotadv1.ReleaseSlotRequest{Policy: s.Policy, Key: s.Key, SlotId: s.ID, Limit: limitProto(s.Limit)}
	res, err := c.svc.ReleaseSlot(ctx, connect.NewRequest(req))
	if err != nil {
		return Decision{}, fmt.Errorf("release of a slot of policy %q: %w", s.Policy, err)
	}
	m := res.Msg
	return Decision{
		Decision: algorithms.Decision{Allowed: true, Limit: m.GetLimit(), Remaining: m.GetRemaining()},
		Source:   SourceStore,
	}, nil
}

// limitProto is an inline limit on the wire; nil for none.
func limitProto(l *algorithms.Limit) *quotadv1.Limit {
	if l == nil {
		return nil
	}
	return &quotadv1.Limit{
		Algorithm: protoconv.AlgorithmToProto(l.Algorithm),
		Limit:     l.Limit,
		Period:    durationpb.New(l.Period),
		Burst:     l.Burst,
	}
}
