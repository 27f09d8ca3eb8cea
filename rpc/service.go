package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// service implements quotad.v1.QuotaService on a node: the one service
// core of both front ends. Its lower-case methods take and return plain
// messages, and the front ends call them: its exported methods for
// connect-go's handlers, grpc.go's for grpc-go's. They return plain domain
// errors, which each front end gives their codes with connectError. It is
// safe for concurrent use.
type service struct {
	node     *node.Node
	policies policyResolver
	maxBatch int
	// noClientLeases answers AcquireLease without granting (lease_rpc.go).
	noClientLeases bool
	log            *slog.Logger
	tracer         trace.Tracer // never nil
}

var _ quotadv1connect.QuotaServiceHandler = (*service)(nil)

// Check implements QuotaService.Check.
func (s *service) Check(ctx context.Context, req *connect.Request[quotadv1.CheckRequest]) (*connect.Response[quotadv1.CheckResponse], error) {
	res, err := s.check(ctx, s.node.PolicySet(), req.Msg, node.CheckOptions{})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// check decides one request with the configured policies set, made as o
// says. Errors are
// returned unwrapped: node's and this package's already name the field, and
// that text is what the client reads.
func (s *service) check(ctx context.Context, set *node.PolicySet, req *quotadv1.CheckRequest, o node.CheckOptions) (*quotadv1.CheckResponse, error) {
	// node.Check validates the key too; validating it before resolving the
	// policy makes a malformed request InvalidArgument even when its policy
	// is also unknown.
	if err := node.ValidateKey(req.GetKey()); err != nil {
		return nil, err
	}
	p, err := s.policies.resolve(set, req)
	if err != nil {
		return nil, err
	}
	res, err := s.node.CheckWith(ctx, p, req.GetKey(), costFromProto(req), o)
	if err != nil {
		return nil, err
	}
	return withSlot(checkResponse(res), res, p), nil
}

// checkNow decides one request with the policies configured now: Check's
// core, for the gRPC front end.
func (s *service) checkNow(ctx context.Context, req *quotadv1.CheckRequest) (*quotadv1.CheckResponse, error) {
	return s.check(ctx, s.node.PolicySet(), req, node.CheckOptions{})
}

// CheckBatch implements QuotaService.CheckBatch.
func (s *service) CheckBatch(ctx context.Context, req *connect.Request[quotadv1.CheckBatchRequest]) (*connect.Response[quotadv1.CheckBatchResponse], error) {
	res, err := s.checkBatch(ctx, req.Spec().Procedure, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// checkBatch decides 1 to maxBatch checks, each with its own result or
// error. Only a batch of the wrong size, or the caller's context ending,
// fails the call. With all_or_nothing the checks are decided as one
// (checkAll), otherwise independently (checkEach). procedure names the
// call in the log.
func (s *service) checkBatch(ctx context.Context, procedure string, req *quotadv1.CheckBatchRequest) (*quotadv1.CheckBatchResponse, error) {
	items := req.GetRequests()
	if n := len(items); n == 0 || n > s.maxBatch {
		return nil, fmt.Errorf("requests: %w: %d checks; send 1 to %d", errInvalidRequest, n, s.maxBatch)
	}
	ctx, span := s.tracer.Start(ctx, batchSpanName, trace.WithAttributes(attrBatchSize.Int(len(items))))
	defer span.End()
	// The caller waits for every item: a store may serve single checks
	// before them (node.CheckOptions.Bulk).
	bulk := node.CheckOptions{Bulk: true}
	// One set for the whole batch: a reload in the middle of it does not
	// decide some items by the old policies and others by the new.
	set := s.node.PolicySet()
	if req.GetAllOrNothing() {
		return s.checkAll(ctx, set, items, bulk)
	}
	return s.checkEach(ctx, procedure, set, items, bulk)
}

// checkEach decides items independently, up to node.BatchParallel at once.
// Items of one policy and key are decided one after another in request
// order, as they would be alone, so that an earlier item is never denied
// for a later one's cost.
func (s *service) checkEach(ctx context.Context, procedure string, set *node.PolicySet, items []*quotadv1.CheckRequest, o node.CheckOptions) (*quotadv1.CheckBatchResponse, error) {
	results := make([]*quotadv1.CheckBatchResult, len(items))
	groups := groupByKey(items)
	run := func(group []int) {
		for _, i := range group {
			// Once the caller has gone, the remaining items would all fail
			// the same way and nobody would read them.
			if ctx.Err() != nil {
				return
			}
			results[i] = s.checkItem(ctx, procedure, set, items[i], o)
		}
	}
	if workers := min(len(groups), node.BatchParallel); workers <= 1 {
		for _, g := range groups {
			run(g)
		}
	} else {
		var next atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for g := next.Add(1) - 1; g < int64(len(groups)); g = next.Add(1) - 1 {
					run(groups[g])
				}
			}()
			// A chunk at a time (node.BatchSpawnChunk), so that a single
			// check's request runs between chunks.
			if w%node.BatchSpawnChunk == node.BatchSpawnChunk-1 {
				runtime.Gosched()
			}
		}
		wg.Wait()
	}
	for i, r := range results {
		if r == nil {
			return nil, fmt.Errorf("requests[%d]: %w", i, ctx.Err())
		}
	}
	return &quotadv1.CheckBatchResponse{Results: results}, nil
}

// checkItem decides one item of a batch: its response or its error.
func (s *service) checkItem(ctx context.Context, procedure string, set *node.PolicySet, item *quotadv1.CheckRequest, o node.CheckOptions) *quotadv1.CheckBatchResult {
	res, err := s.check(ctx, set, item, o)
	if err != nil {
		ce := connectError(ctx, s.log, procedure, err)
		return &quotadv1.CheckBatchResult{Result: &quotadv1.CheckBatchResult_Error{
			Error: &quotadv1.ItemError{Code: ce.Code().String(), Message: ce.Message()},
		}}
	}
	return &quotadv1.CheckBatchResult{Result: &quotadv1.CheckBatchResult_Response{Response: res}}
}

// groupByKey returns the indexes of items grouped by policy (or inline
// namespace) and key, each group in request order, the groups in the
// order of their first item.
func groupByKey(items []*quotadv1.CheckRequest) [][]int {
	type name struct{ policy, key string }
	at := make(map[name]int, len(items))
	groups := make([][]int, 0, len(items))
	for i, item := range items {
		n := name{item.GetPolicy(), item.GetKey()}
		g, ok := at[n]
		if !ok {
			g = len(groups)
			at[n] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// checkAll decides a batch all or nothing (node.CheckAll). An invalid item
// fails the whole call, named as requests[i], with that item's code: with
// nothing decided, there is no result to give the others.
func (s *service) checkAll(ctx context.Context, set *node.PolicySet, reqs []*quotadv1.CheckRequest, o node.CheckOptions) (*quotadv1.CheckBatchResponse, error) {
	items := make([]node.Item, len(reqs))
	for i, req := range reqs {
		// As in check: a malformed key is InvalidArgument even when the
		// policy is unknown too.
		if err := node.ValidateKey(req.GetKey()); err != nil {
			return nil, fmt.Errorf("requests[%d]: %w", i, err)
		}
		p, err := s.policies.resolve(set, req)
		if err != nil {
			return nil, fmt.Errorf("requests[%d]: %w", i, err)
		}
		items[i] = node.Item{Policy: p, Key: req.GetKey(), Cost: costFromProto(req)}
	}
	res, err := s.node.CheckAllWith(ctx, items, o)
	if ie := (*node.ItemError)(nil); errors.As(err, &ie) {
		return nil, fmt.Errorf("requests[%d]: %w", ie.Index, ie.Err)
	}
	if err != nil {
		return nil, err
	}
	results := make([]*quotadv1.CheckBatchResult, len(res))
	for i, r := range res {
		results[i] = &quotadv1.CheckBatchResult{Result: &quotadv1.CheckBatchResult_Response{Response: checkResponse(r)}}
	}
	return &quotadv1.CheckBatchResponse{Results: results}, nil
}

// Reset implements QuotaService.Reset.
func (s *service) Reset(ctx context.Context, req *connect.Request[quotadv1.ResetRequest]) (*connect.Response[quotadv1.ResetResponse], error) {
	res, err := s.reset(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// reset resets a key's state. It accepts any valid name, configured or
// not, since inline namespaces have state too.
func (s *service) reset(ctx context.Context, req *quotadv1.ResetRequest) (*quotadv1.ResetResponse, error) {
	if err := s.node.Reset(ctx, req.GetPolicy(), req.GetKey()); err != nil {
		return nil, err
	}
	return &quotadv1.ResetResponse{}, nil
}

// ListPolicies implements QuotaService.ListPolicies.
func (s *service) ListPolicies(ctx context.Context, req *connect.Request[quotadv1.ListPoliciesRequest]) (*connect.Response[quotadv1.ListPoliciesResponse], error) {
	res, err := s.listPolicies(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// listPolicies returns the configured policies, sorted by name.
func (s *service) listPolicies(_ context.Context, _ *quotadv1.ListPoliciesRequest) (*quotadv1.ListPoliciesResponse, error) {
	ps := s.node.Policies()
	out := make([]*quotadv1.Policy, len(ps))
	for i, p := range ps {
		out[i] = policyToProto(p)
	}
	return &quotadv1.ListPoliciesResponse{Policies: out}, nil
}

// withSlot adds the slot an allowed concurrency check took to its
// response: its id and how long it lives unless renewed.
func withSlot(resp *quotadv1.CheckResponse, res node.Result, p node.Policy) *quotadv1.CheckResponse {
	if res.Slot != "" {
		resp.SlotId = proto.String(res.Slot)
		resp.SlotExpiresAfter = durationpb.New(p.Limit.Period)
	}
	return resp
}
