package quotadclient

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// Reservation names a reservation Reserve made: the limit and key it
// named, and its id. The zero ID is no reservation.
type Reservation struct {
	// Policy is the configured policy or, with Limit, the inline limit's
	// namespace.
	Policy string
	// Limit is the inline limit; nil for a configured policy.
	Limit *algorithms.Limit
	Key   string
	ID    string
	// ExpiresAfter is how long, from the Reserve, it waits for its
	// settle; not settled by then, it stays charged its estimate.
	ExpiresAfter time.Duration
}

// Settlement is quotad's answer to Settle (algorithms.Settlement): the
// outcome, what it refunded or charged, and the key after it.
type Settlement = algorithms.Settlement

// Reserve decides whether key may spend estimate units of policy now, as
// Check does, and when it may, reserves them until the work is done and
// its actual cost known: settle it then with Settle. lifetime is how long
// the reservation waits for its settle (0: quotad's default, 10 minutes);
// not settled by then, it stays charged its estimate. Reservations are
// always decided by quotad, also in local mode. Errors are as Check's;
// a concurrency limit is InvalidArgument.
func (c *Client) Reserve(ctx context.Context, policy, key string, estimate int64, lifetime time.Duration) (Decision, Reservation, error) {
	return c.reserve(ctx, policy, nil, key, estimate, lifetime)
}

// ReserveLimit is Reserve with an inline limit, as CheckLimit.
func (c *Client) ReserveLimit(ctx context.Context, namespace string, limit algorithms.Limit, key string, estimate int64, lifetime time.Duration) (Decision, Reservation, error) {
	return c.reserve(ctx, namespace, &limit, key, estimate, lifetime)
}

func (c *Client) reserve(ctx context.Context, policy string, limit *algorithms.Limit, key string, estimate int64, lifetime time.Duration) (Decision, Reservation, error) {
	req := &quotadv1.ReserveRequest{Policy: policy, Key: key, Cost: &estimate, Limit: limitProto(limit)}
	if lifetime != 0 {
		req.Lifetime = durationpb.New(lifetime)
	}
	res, err := c.svc.Reserve(ctx, connect.NewRequest(req))
	if err != nil {
		return Decision{}, Reservation{}, fmt.Errorf("reserve of policy %q: %w", policy, err)
	}
	d := decisionFromProto(res.Msg.GetDecision())
	rv := Reservation{Policy: policy, Limit: limit, Key: key}
	if id := res.Msg.GetReservationId(); id != "" {
		rv.ID, rv.ExpiresAfter = id, res.Msg.GetExpiresAfter().AsDuration()
	}
	return d, rv, nil
}

// Settle ends reservation r with the units the work actually used: the
// unused part of the estimate goes back, a cost beyond it is charged and
// always counts (into debt when it does not fit: later checks are denied
// until the window or refill pays it back). It is safe to retry: a settle
// that was applied before reports algorithms.SettledBefore and changes
// nothing; one of a reservation past its lifetime reports
// algorithms.NoReservation. A reservation with no ID (Reserve denied it)
// settles to NoReservation without a call. A failed call (code
// Unavailable) may be retried. It blocks until quotad answers or ctx ends.
func (c *Client) Settle(ctx context.Context, r Reservation, actual int64) (Settlement, error) {
	if r.ID == "" {
		return Settlement{Outcome: algorithms.NoReservation}, nil
	}
	req := &quotadv1.SettleRequest{Policy: r.Policy, Key: r.Key, Limit: limitProto(r.Limit), ReservationId: r.ID, Actual: actual}
	res, err := c.svc.Settle(ctx, connect.NewRequest(req))
	if err != nil {
		return Settlement{}, fmt.Errorf("settle of a reservation of policy %q: %w", r.Policy, err)
	}
	m := res.Msg
	out := Settlement{
		Recorded: m.GetActualRecorded(),
		Refunded: m.GetRefunded(),
		Charged:  m.GetCharged(),
		After:    decisionFromProto(m.GetAfter()).Decision,
	}
	switch m.GetOutcome() {
	case quotadv1.SettleOutcome_SETTLE_OUTCOME_SETTLED:
		out.Outcome = algorithms.Settled
	case quotadv1.SettleOutcome_SETTLE_OUTCOME_SETTLED_BEFORE:
		out.Outcome = algorithms.SettledBefore
	default:
		out.Outcome = algorithms.NoReservation
	}
	return out, nil
}
