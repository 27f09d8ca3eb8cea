package quotadclient

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// batcher sends concurrent checks to quotad together, as one CheckBatch. A
// check is sent at once when no call of the batcher is in flight (so a
// quiet client waits for nobody); otherwise it waits with the checks that
// arrive after it until max of them have gathered or window has passed
// since it arrived, whichever comes first.
type batcher struct {
	svc    serviceClient
	window time.Duration // < 0: every check alone
	max    int

	mu       sync.Mutex
	pending  []*pendingCheck
	timer    *time.Timer // armed while pending waits for the window
	inFlight int

	remote, batches atomic.Int64
}

// pendingCheck is one check waiting for its batch's answer.
type pendingCheck struct {
	ctx  context.Context
	req  *quotadv1.CheckRequest
	done chan struct{}
	d    Decision
	err  error
}

// batchCallTimeout bounds a batch call whose checks have no deadline.
const batchCallTimeout = 10 * time.Second

func newBatcher(svc serviceClient, window time.Duration, maxBatch int) *batcher {
	return &batcher{svc: svc, window: window, max: maxBatch}
}

// check sends req with the checks around it and waits for its answer or
// ctx's end.
func (b *batcher) check(ctx context.Context, req *quotadv1.CheckRequest) (Decision, error) {
	b.remote.Add(1)
	if b.window < 0 {
		res, err := b.svc.Check(ctx, connect.NewRequest(req))
		if err != nil {
			return Decision{}, err
		}
		return decisionFromProto(res.Msg), nil
	}
	pc := &pendingCheck{ctx: ctx, req: req, done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, pc)
	var send []*pendingCheck
	switch {
	case b.inFlight == 0 || len(b.pending) >= b.max:
		send = b.takeLocked()
	case b.timer == nil:
		b.timer = time.AfterFunc(b.window, b.flush)
	}
	b.mu.Unlock()
	if send != nil {
		go b.send(send)
	}
	select {
	case <-pc.done:
		return pc.d, pc.err
	case <-ctx.Done():
		return Decision{}, ctxError(ctx)
	}
}

// takeLocked takes the pending checks for a call. b.mu held.
func (b *batcher) takeLocked() []*pendingCheck {
	send := b.pending
	b.pending = nil
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	b.inFlight++
	return send
}

// flush sends what is pending: the window has passed.
func (b *batcher) flush() {
	b.mu.Lock()
	var send []*pendingCheck
	if len(b.pending) > 0 {
		send = b.takeLocked()
	}
	b.mu.Unlock()
	if send != nil {
		b.send(send)
	}
}

// send makes one call for checks and hands each its answer.
func (b *batcher) send(checks []*pendingCheck) {
	ctx, cancel := batchContext(checks)
	defer cancel()
	if len(checks) == 1 {
		pc := checks[0]
		res, err := b.svc.Check(ctx, connect.NewRequest(pc.req))
		if err != nil {
			pc.err = err
		} else {
			pc.d = decisionFromProto(res.Msg)
		}
		close(pc.done)
	} else {
		b.sendBatch(ctx, checks)
	}
	// Checks that gathered meanwhile wait for their window or their
	// number: sent now, the first of the callers this call woke would go
	// almost alone.
	b.mu.Lock()
	b.inFlight--
	b.mu.Unlock()
}

// sendBatch makes one CheckBatch of checks.
func (b *batcher) sendBatch(ctx context.Context, checks []*pendingCheck) {
	b.batches.Add(1)
	reqs := make([]*quotadv1.CheckRequest, len(checks))
	for i, pc := range checks {
		reqs[i] = pc.req
	}
	res, err := b.svc.CheckBatch(ctx, connect.NewRequest(&quotadv1.CheckBatchRequest{Requests: reqs}))
	if err == nil && len(res.Msg.GetResults()) != len(checks) {
		err = connect.NewError(connect.CodeInternal, errors.New("quotad answered a CheckBatch with a wrong number of results"))
	}
	if connect.CodeOf(err) == connect.CodeInvalidArgument {
		// A batch larger than quotad's --max-batch: each check alone.
		for _, pc := range checks {
			r, err := b.svc.Check(ctx, connect.NewRequest(pc.req))
			if err != nil {
				pc.err = err
			} else {
				pc.d = decisionFromProto(r.Msg)
			}
			close(pc.done)
		}
		return
	}
	for i, pc := range checks {
		switch {
		case err != nil:
			pc.err = err
		case res.Msg.GetResults()[i].GetError() != nil:
			pc.err = itemError(res.Msg.GetResults()[i].GetError())
		default:
			pc.d = decisionFromProto(res.Msg.GetResults()[i].GetResponse())
		}
		close(pc.done)
	}
}

// itemError is a batch item's error with its Connect code, as a Check of
// that item alone would have returned it.
func itemError(e *quotadv1.ItemError) error {
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.GetCode())); err != nil {
		code = connect.CodeUnknown
	}
	return connect.NewError(code, errors.New(e.GetMessage()))
}

// batchContext bounds a call by the latest deadline of its checks (some
// wait that long for it), or batchCallTimeout when one has none. Each
// check stops waiting when its own context ends.
func batchContext(checks []*pendingCheck) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, pc := range checks {
		dl, ok := pc.ctx.Deadline()
		if !ok {
			latest = time.Now().Add(batchCallTimeout)
			break
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	return context.WithDeadline(context.Background(), latest)
}
