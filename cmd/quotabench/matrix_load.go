package main

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/quotad/quotad/internal/redisbench"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// The matrix's load: closed-loop clients, each with one call in flight, on
// one grpc-go connection per target (as a service's client library would
// hold it), or pipelined INCRBY+PEXPIRE for the Redis floor.

// Full gRPC method names the matrix calls.
const (
	methodCheck           = "/quotad.v1.QuotaService/Check"
	methodCheckBatch      = "/quotad.v1.QuotaService/CheckBatch"
	methodShouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
)

// callTally is what one client saw. Each client owns one.
type callTally struct {
	hist histogram // latency per call
	// calls answered; checks is calls × checks per call.
	calls, checks    int64
	allowed, denied  int64
	sources          [numSources]int64
	errors           map[string]int64
	firstErrorDetail string
}

// callOutcome is a cell's run: every client's tally merged.
type callOutcome struct {
	elapsed                        time.Duration
	latency                        merged
	calls, checks, allowed, denied int64
	sources                        [numSources]int64
	errors                         map[string]int64
	firstErrorDetail               string
}

func (o *callOutcome) add(t *callTally) {
	o.latency.add(&t.hist)
	o.calls += t.calls
	o.checks += t.checks
	o.allowed += t.allowed
	o.denied += t.denied
	for i := range o.sources {
		o.sources[i] += t.sources[i]
	}
	for c, n := range t.errors {
		o.errors[c] += n
	}
	if o.firstErrorDetail == "" {
		o.firstErrorDetail = t.firstErrorDetail
	}
}

func (o *callOutcome) failed() int64 {
	var n int64
	for _, c := range o.errors {
		n += c
	}
	return n
}

// clientCall is one client's request and response messages, reused from
// call to call, and how to vary the one and read the other.
type clientCall struct {
	req, resp proto.Message
	// next prepares req for the next call (a new key); may be nil.
	next func()
	// record counts the decisions in resp.
	record func(t *callTally)
}

// workload is what a cell's clients send.
type workload struct {
	method string
	// newClient makes client i's call.
	newClient func(i int) clientCall
}

// keyPicker returns client i's key source: one key, or keys drawn uniformly
// from nkeys, seeded by the client's index so runs repeat.
func keyPicker(prefix string, nkeys, client int) func() string {
	if nkeys <= 1 {
		k := prefix + "0"
		return func() string { return k }
	}
	r := rand.New(rand.NewPCG(1, uint64(client)))
	buf := make([]byte, 0, len(prefix)+20)
	return func() string {
		buf = strconv.AppendUint(append(buf[:0], prefix...), r.Uint64N(uint64(nkeys)), 10)
		return string(buf)
	}
}

// checkWorkload sends Check (items == 1) or CheckBatch of items checks,
// every check on the configured policy.
func checkWorkload(policy, keyPrefix string, nkeys, items int) workload {
	if items <= 1 {
		return workload{method: methodCheck, newClient: func(i int) clientCall {
			key := keyPicker(keyPrefix, nkeys, i)
			req := &quotadv1.CheckRequest{Policy: policy, Key: key()}
			resp := &quotadv1.CheckResponse{}
			return clientCall{req: req, resp: resp,
				next:   func() { req.Key = key() },
				record: func(t *callTally) { t.checks++; recordCheck(t, resp) },
			}
		}}
	}
	return workload{method: methodCheckBatch, newClient: func(i int) clientCall {
		key := keyPicker(keyPrefix, nkeys, i)
		req := &quotadv1.CheckBatchRequest{Requests: make([]*quotadv1.CheckRequest, items)}
		for j := range req.Requests {
			req.Requests[j] = &quotadv1.CheckRequest{Policy: policy, Key: key()}
		}
		resp := &quotadv1.CheckBatchResponse{}
		return clientCall{req: req, resp: resp,
			next: func() {
				if nkeys > 1 {
					for _, r := range req.Requests {
						r.Key = key()
					}
				}
			},
			record: func(t *callTally) {
				for _, r := range resp.GetResults() {
					t.checks++
					if e := r.GetError(); e != nil {
						countError(t, e.GetCode(), e.GetMessage())
						continue
					}
					recordCheck(t, r.GetResponse())
				}
			},
		}
	}}
}

func recordCheck(t *callTally, r *quotadv1.CheckResponse) {
	src := int(r.GetSource())
	if src < 0 || src >= numSources {
		src = 0
	}
	t.sources[src]++
	if r.GetAllowed() {
		t.allowed++
	} else {
		t.denied++
	}
}

// rlsWorkload sends ShouldRateLimit for domain with items descriptors,
// each one entry (entryKey, key).
func rlsWorkload(domain, entryKey, keyPrefix string, nkeys, items int) workload {
	return workload{method: methodShouldRateLimit, newClient: func(i int) clientCall {
		key := keyPicker(keyPrefix, nkeys, i)
		req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: make([]*rlscommonv3.RateLimitDescriptor, max(items, 1))}
		for j := range req.Descriptors {
			req.Descriptors[j] = &rlscommonv3.RateLimitDescriptor{Entries: []*rlscommonv3.RateLimitDescriptor_Entry{{Key: entryKey, Value: key()}}}
		}
		resp := &rlsv3.RateLimitResponse{}
		return clientCall{req: req, resp: resp,
			next: func() {
				if nkeys > 1 {
					for _, d := range req.Descriptors {
						d.Entries[0].Value = key()
					}
				}
			},
			record: func(t *callTally) {
				for _, st := range resp.GetStatuses() {
					t.checks++
					if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
						t.denied++
					} else {
						t.allowed++
					}
				}
			},
		}
	}}
}

func countError(t *callTally, code, detail string) {
	t.errors[code]++
	if t.firstErrorDetail == "" {
		t.firstErrorDetail = code + ": " + detail
	}
}

// runCalls drives conn with w: clients workers, one call in flight each,
// starting calls until d has passed, maxCalls calls have started (0: no
// cap) or ctx is done. Calls in flight at the end finish and count.
func runCalls(ctx context.Context, conn *grpc.ClientConn, w workload, clients int, d time.Duration, maxCalls int64, timeout time.Duration) callOutcome {
	stopAt, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var started atomic.Int64
	tallies := make([]callTally, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range tallies {
		t := &tallies[i]
		t.errors = map[string]int64{}
		call := w.newClient(i)
		wg.Go(func() {
			for stopAt.Err() == nil {
				if maxCalls > 0 && started.Add(1) > maxCalls {
					return
				}
				if call.next != nil {
					call.next()
				}
				cctx, cancel := context.WithTimeout(ctx, timeout)
				begin := time.Now()
				err := conn.Invoke(cctx, w.method, call.req, call.resp)
				took := time.Since(begin)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					s := status.Convert(err)
					countError(t, s.Code().String(), s.Message())
					continue
				}
				t.hist.record(took)
				t.calls++
				call.record(t)
			}
		})
	}
	wg.Wait()
	o := callOutcome{elapsed: time.Since(start), errors: map[string]int64{}}
	for i := range tallies {
		o.add(&tallies[i])
	}
	return o
}

// floorOp is what a Redis floor sends per operation.
type floorOp int

const (
	// counterOp is INCRBY and PEXPIRE in one pipeline: envoyproxy/ratelimit's
	// counter.
	counterOp floorOp = iota
	// logOp is the sorted-set sliding log's four commands in one pipeline
	// (redisbench.Client.LogAppend): what its commands alone cost.
	logOp
	// logScriptOp is the same log made exact in one script call
	// (redisbench.Client.LogCheck): the least an exact sorted-set log
	// costs, one check per call.
	logScriptOp
)

// logFloorLimit is the scripted log floor's limit: the cold scenario's, so
// that its checks are all allowed, as the cold scenario's are.
const logFloorLimit = 1_000_000

// runRedisFloor is a Redis floor, straight to Redis: clients workers each
// send op (floorOp; counterOp is envoyproxy/ratelimit's counter, INCRBY key
// 1 and PEXPIRE key in one pipeline) per operation, keys drawn uniformly
// from nkeys, until d has passed or maxCalls operations have started. One operation counts as one allowed
// check. With rate 0 each worker sends as fast as Redis answers; with a
// rate (operations a second, all workers together) each worker sends on
// a schedule of its share, staggered, so that Redis sees the traffic a
// target served at that rate: how much Redis spends per operation depends
// on how many arrive per wakeup of its event loop.
func runRedisFloor(ctx context.Context, rc *redisbench.Client, op floorOp, keyPrefix string, nkeys, clients int, rate float64, d time.Duration, maxCalls int64) callOutcome {
	stopAt, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var started atomic.Int64
	tallies := make([]callTally, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range tallies {
		t := &tallies[i]
		t.errors = map[string]int64{}
		key := keyPicker(keyPrefix, nkeys, i)
		var every time.Duration
		if rate > 0 {
			every = time.Duration(float64(clients) / rate * float64(time.Second))
		}
		next := start.Add(every * time.Duration(i) / time.Duration(clients))
		wg.Go(func() {
			seq := 0
			for stopAt.Err() == nil {
				if maxCalls > 0 && started.Add(1) > maxCalls {
					return
				}
				if every > 0 {
					if !sleepUntil(stopAt, next) {
						return
					}
					next = next.Add(every)
				}
				k := key()
				begin := time.Now()
				var err error
				if op == counterOp {
					err = rc.IncrExpire(ctx, k, time.Hour)
				} else {
					// A member new to every key: the worker and its count.
					seq++
					member := strconv.Itoa(i) + ":" + strconv.Itoa(seq)
					if op == logOp {
						err = rc.LogAppend(ctx, k, member, begin.UnixMilli(), time.Hour)
					} else {
						_, err = rc.LogCheck(ctx, k, member, begin.UnixMilli(), time.Hour, logFloorLimit)
					}
				}
				took := time.Since(begin)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					countError(t, "redis", err.Error())
					continue
				}
				t.hist.record(took)
				t.calls++
				t.checks++
				t.allowed++
			}
		})
	}
	wg.Wait()
	o := callOutcome{elapsed: time.Since(start), errors: map[string]int64{}}
	for i := range tallies {
		o.add(&tallies[i])
	}
	return o
}

// sleepUntil waits until t; it reports false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}
