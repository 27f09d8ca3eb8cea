package attack

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// KeyFlood grows a server's key state: every Every it sends a CheckBatch
// of Batch distinct keys, each KeyBytes long and never used again, with an
// inline fixed window of Period. The first round and every fourth after it
// also send a batch
// whose limits last LongPeriod (beyond the server's --max-inline-period:
// each item should be InvalidArgument) and a batch of MaxBatch+1 items
// (the whole call should be refused). Set the fields before Run; Stats may
// be read at any time.
type KeyFlood struct {
	Client quotadv1connect.QuotaServiceClient
	// Namespace is the inline keys' policy field.
	Namespace       string
	Batch, KeyBytes int
	Period          time.Duration
	LongPeriod      time.Duration
	MaxBatch        int
	Every           time.Duration

	round, ticks                                 atomic.Int64
	batches, allowed, denied, invalid, exhausted atomic.Int64
	longInvalid, oversizeRefused, other          atomic.Int64
	mu                                           sync.Mutex
	lastOther                                    string
}

// KeyFloodStats counts a KeyFlood's checks.
type KeyFloodStats struct {
	// Batches counts the batches of new keys sent; Allowed and Denied
	// their items decided, Invalid and Exhausted their items refused
	// (InvalidArgument, ResourceExhausted). LongInvalid counts the items
	// of long-lived limits refused as InvalidArgument; OversizeRefused the
	// oversized batches refused whole. Other counts anything else
	// (LastOther says what, last).
	Batches, Allowed, Denied, Invalid, Exhausted int64
	LongInvalid, OversizeRefused, Other          int64
	LastOther                                    string
}

// Stats returns the counts so far.
func (a *KeyFlood) Stats() KeyFloodStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return KeyFloodStats{
		Batches: a.batches.Load(), Allowed: a.allowed.Load(), Denied: a.denied.Load(), Invalid: a.invalid.Load(), Exhausted: a.exhausted.Load(),
		LongInvalid: a.longInvalid.Load(), OversizeRefused: a.oversizeRefused.Load(), Other: a.other.Load(), LastOther: a.lastOther,
	}
}

// Run floods until ctx ends.
func (a *KeyFlood) Run(ctx context.Context) {
	t := time.NewTicker(orDefault(a.Every, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // a tick and the end at once: the end wins
			return
		}
		a.once(ctx)
	}
}

func (a *KeyFlood) fail(format string, args ...any) {
	a.other.Add(1)
	a.mu.Lock()
	a.lastOther = fmt.Sprintf(format, args...)
	a.mu.Unlock()
}

func (a *KeyFlood) batch(n int, period time.Duration) *quotadv1.CheckBatchRequest {
	round := a.round.Add(1)
	lim := &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_FIXED_WINDOW, Limit: 5, Period: durationpb.New(period)}
	reqs := make([]*quotadv1.CheckRequest, n)
	for i := range reqs {
		id := fmt.Sprintf("-%d-%d", round, i)
		key := strings.Repeat("k", max(0, a.KeyBytes-len(id))) + id
		reqs[i] = &quotadv1.CheckRequest{Policy: a.Namespace, Key: key, Limit: lim}
	}
	return &quotadv1.CheckBatchRequest{Requests: reqs}
}

func (a *KeyFlood) once(ctx context.Context) {
	tick := a.ticks.Add(1)
	// A round under way when Run's context ends is seen through.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	res, err := a.Client.CheckBatch(ctx, connect.NewRequest(a.batch(a.Batch, a.Period)))
	if err != nil {
		a.fail("batch: %v", err)
		return
	}
	a.batches.Add(1)
	for _, r := range res.Msg.GetResults() {
		switch code := r.GetError().GetCode(); {
		case r.GetError() == nil && r.GetResponse().GetAllowed():
			a.allowed.Add(1)
		case r.GetError() == nil:
			a.denied.Add(1)
		case code == connect.CodeInvalidArgument.String():
			a.invalid.Add(1)
		case code == connect.CodeResourceExhausted.String():
			a.exhausted.Add(1)
		default:
			a.fail("item: %s %s", code, r.GetError().GetMessage())
		}
	}
	if tick%4 != 1 {
		return
	}
	if a.LongPeriod > 0 {
		res, err := a.Client.CheckBatch(ctx, connect.NewRequest(a.batch(a.Batch, a.LongPeriod)))
		if err != nil {
			a.fail("long batch: %v", err)
			return
		}
		for _, r := range res.Msg.GetResults() {
			if r.GetError().GetCode() == connect.CodeInvalidArgument.String() {
				a.longInvalid.Add(1)
			} else {
				a.fail("long item: %v", r)
			}
		}
	}
	if a.MaxBatch > 0 {
		_, err := a.Client.CheckBatch(ctx, connect.NewRequest(a.batch(a.MaxBatch+1, a.Period)))
		if connect.CodeOf(err) == connect.CodeInvalidArgument {
			a.oversizeRefused.Add(1)
		} else {
			a.fail("oversized batch: %v", err)
		}
	}
}
