package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// fw5 is an inline fixed window of 5 per minute; modify a copy per case.
func fw5() *quotadv1.Limit {
	return &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_FIXED_WINDOW, Limit: 5, Period: durationpb.New(time.Minute)}
}

func withLimit(f func(l *quotadv1.Limit)) *quotadv1.Limit {
	l := fw5()
	f(l)
	return l
}

// badCheck is one invalid check: the code it must fail with and the text
// its message must contain (the field it names).
type badCheck struct {
	name    string
	req     *quotadv1.CheckRequest
	code    connect.Code
	message string
}

// badChecks is every kind of bad input, against a server with the
// configured policy "configured" (fixed window, 5 per minute).
func badChecks() []badCheck {
	inline := func(f func(l *quotadv1.Limit)) *quotadv1.CheckRequest {
		return &quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: withLimit(f)}
	}
	ia := connect.CodeInvalidArgument
	return []badCheck{
		{"empty key", &quotadv1.CheckRequest{Policy: "demo", Limit: fw5()}, ia, "key: invalid key: must not be empty"},
		{"key over 1 KiB", &quotadv1.CheckRequest{Policy: "demo", Key: strings.Repeat("k", node.MaxKeyLen+1), Limit: fw5()}, ia, "key: invalid key: 1025 bytes exceeds 1024"},
		{"empty key, unknown policy", &quotadv1.CheckRequest{Policy: "nope"}, ia, "key: "},
		{"negative cost", &quotadv1.CheckRequest{Policy: "demo", Key: "k", Cost: proto.Int64(-1), Limit: fw5()}, ia, "cost: invalid cost: -1 must be >= 0"},
		{"cost above capacity", &quotadv1.CheckRequest{Policy: "demo", Key: "k", Cost: proto.Int64(6), Limit: fw5()}, ia, "cost: invalid cost: 6 exceeds"},
		{"cost above a configured capacity", &quotadv1.CheckRequest{Policy: "configured", Key: "k", Cost: proto.Int64(6)}, ia, "cost: "},
		{"limit 0", inline(func(l *quotadv1.Limit) { l.Limit = 0 }), ia, "limit.limit: invalid limit: 0 must be > 0"},
		{"limit negative", inline(func(l *quotadv1.Limit) { l.Limit = -5 }), ia, "limit.limit: "},
		{"limit too large", inline(func(l *quotadv1.Limit) { l.Limit = algorithms.MaxExact + 1 }), ia, "limit.limit: "},
		{"period 0", inline(func(l *quotadv1.Limit) { l.Period = durationpb.New(0) }), ia, "limit.period: invalid period: 0s must be at least 1ms"},
		{"period negative", inline(func(l *quotadv1.Limit) { l.Period = durationpb.New(-time.Second) }), ia, "limit.period: "},
		{"period missing", inline(func(l *quotadv1.Limit) { l.Period = nil }), ia, "limit.period: invalid period: missing"},
		{"period over a year", inline(func(l *quotadv1.Limit) { l.Period = durationpb.New(366 * 24 * time.Hour) }), ia, "limit.period: invalid period: 8784h0m0s exceeds 365 days"},
		{"period beyond time.Duration", inline(func(l *quotadv1.Limit) { l.Period = &durationpb.Duration{Seconds: 315_576_000_000} }), ia, "limit.period: "},
		{"period not whole ms", inline(func(l *quotadv1.Limit) { l.Period = durationpb.New(1500 * time.Microsecond) }), ia, "limit.period: invalid period: 1.5ms is not a whole number of milliseconds"},
		{"period invalid Duration", inline(func(l *quotadv1.Limit) { l.Period = &durationpb.Duration{Seconds: 1, Nanos: -1} }), ia, "limit.period: invalid period: "},
		{"period nanos out of range", inline(func(l *quotadv1.Limit) { l.Period = &durationpb.Duration{Nanos: 1_000_000_000} }), ia, "limit.period: "},
		{"algorithm 99", inline(func(l *quotadv1.Limit) { l.Algorithm = 99 }), ia, "limit.algorithm: unknown algorithm 99"},
		{"algorithm unspecified", inline(func(l *quotadv1.Limit) { l.Algorithm = quotadv1.Algorithm_ALGORITHM_UNSPECIFIED }), ia, "limit.algorithm: unknown algorithm ALGORITHM_UNSPECIFIED"},
		{"empty limit", &quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: &quotadv1.Limit{}}, ia, "limit.algorithm: "},
		{"burst on a window algorithm", inline(func(l *quotadv1.Limit) { l.Burst = 10 }), ia, "limit.burst: invalid burst: fixed_window has no burst"},
		{"negative burst", inline(func(l *quotadv1.Limit) {
			l.Algorithm = quotadv1.Algorithm_ALGORITHM_TOKEN_BUCKET
			l.Burst = -1
		}), ia, "limit.burst: "},
		{"failure mode 7", inline(func(l *quotadv1.Limit) { l.OnStoreError = 7 }), ia, "limit.on_store_error: invalid failure mode 7"},
		{"policy with ':'", &quotadv1.CheckRequest{Policy: "a:b", Key: "k", Limit: fw5()}, ia, `policy: invalid policy name: "a:b" has ':' at byte 1`},
		{"policy with a space", &quotadv1.CheckRequest{Policy: "a b", Key: "k"}, ia, "policy: invalid policy name"},
		{"policy not ASCII", &quotadv1.CheckRequest{Policy: "Привет", Key: "k", Limit: fw5()}, ia, `policy: invalid policy name: "Привет" has 'П' at byte 0; use A-Z a-z 0-9 _ . -`},
		{"empty policy", &quotadv1.CheckRequest{Key: "k", Limit: fw5()}, ia, "policy: invalid policy name: must not be empty"},
		{"policy over 128 bytes", &quotadv1.CheckRequest{Policy: strings.Repeat("p", 129), Key: "k", Limit: fw5()}, ia, "policy: invalid policy name: 129 bytes exceeds 128"},
		{"unknown policy", &quotadv1.CheckRequest{Policy: "nope", Key: "k"}, connect.CodeNotFound, `policy: unknown policy "nope": not configured on this server; ListPolicies shows the configured ones, or send a limit`},
		{"inline limit on a configured policy", &quotadv1.CheckRequest{Policy: "configured", Key: "k", Limit: withLimit(func(l *quotadv1.Limit) { l.Limit = 1000 })}, ia, `limit: policy "configured" is configured on this server; omit limit or choose another namespace`},
	}
}

// Every bad input fails with its exact code and a message naming the field,
// over Connect and over gRPC.
func TestBadChecks(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, node.Policy{Name: "configured", Limit: fiveAMinute})
	for _, protocol := range []string{"connect", "grpc"} {
		c := ts.client(t, protocol)
		for _, tc := range badChecks() {
			t.Run(protocol+"/"+tc.name, func(t *testing.T) {
				res, err := c.Check(context.Background(), connect.NewRequest(tc.req))
				assertError(t, res, err, tc.code, tc.message)
			})
		}
	}
}

func assertError[T any](t *testing.T, res *connect.Response[T], err error, code connect.Code, message string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got %v, want %s error", res.Msg, code)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("got %T %v, want a *connect.Error", err, err)
	}
	if ce.Code() != code || !strings.Contains(ce.Message(), message) {
		t.Fatalf("got %s %q, want %s containing %q", ce.Code(), ce.Message(), code, message)
	}
}

// With inline limits disabled, a limit is PermissionDenied and the
// NotFound hint no longer suggests one.
func TestInlineLimitsDisabled(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{DisableInlineLimits: true}, node.Policy{Name: "configured", Limit: fiveAMinute})
	c := ts.client(t, "grpc")
	ctx := context.Background()
	res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: fw5()}))
	assertError(t, res, err, connect.CodePermissionDenied, "limit: inline limits are disabled on this server; use a configured policy")

	res, err = c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "k"}))
	assertError(t, res, err, connect.CodeNotFound, `policy: unknown policy "demo"`)
	if strings.Contains(err.Error(), "inline") {
		t.Errorf("the NotFound hint suggests inline limits on a server that disables them: %v", err)
	}
	if res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "configured", Key: "k"})); err != nil || !res.Msg.GetAllowed() {
		t.Fatalf("configured policy: %v, %v", res, err)
	}
}

func TestBatch(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, node.Policy{Name: "configured", Limit: fiveAMinute})
	c := ts.client(t, "connect")
	ctx := context.Background()
	good := func(key string) *quotadv1.CheckRequest {
		return &quotadv1.CheckRequest{Policy: "configured", Key: key}
	}
	batch := func(n int) *quotadv1.CheckBatchRequest {
		b := &quotadv1.CheckBatchRequest{}
		for i := range n {
			b.Requests = append(b.Requests, good(fmt.Sprint("k", i)))
		}
		return b
	}

	t.Run("empty", func(t *testing.T) {
		res, err := c.CheckBatch(ctx, connect.NewRequest(batch(0)))
		assertError(t, res, err, connect.CodeInvalidArgument, "requests: invalid request: 0 checks; send 1 to 1000")
	})
	t.Run("1001", func(t *testing.T) {
		res, err := c.CheckBatch(ctx, connect.NewRequest(batch(1001)))
		assertError(t, res, err, connect.CodeInvalidArgument, "requests: invalid request: 1001 checks; send 1 to 1000")
	})
	t.Run("1000", func(t *testing.T) {
		res, err := c.CheckBatch(ctx, connect.NewRequest(batch(1000)))
		if err != nil || len(res.Msg.GetResults()) != 1000 {
			t.Fatalf("%v", err)
		}
		for i, r := range res.Msg.GetResults() {
			if !r.GetResponse().GetAllowed() {
				t.Fatalf("item %d: %v", i, r)
			}
		}
	})
	t.Run("one bad item among good ones", func(t *testing.T) {
		req := &quotadv1.CheckBatchRequest{Requests: []*quotadv1.CheckRequest{
			good("a"),
			{Policy: "configured", Key: ""},
			good("b"),
			{Policy: "nope", Key: "k"},
			{Policy: "demo", Key: "k", Limit: withLimit(func(l *quotadv1.Limit) { l.Period = nil })},
			good("a"),
		}}
		res, err := c.CheckBatch(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		rs := res.Msg.GetResults()
		if len(rs) != len(req.Requests) {
			t.Fatalf("%d results for %d requests", len(rs), len(req.Requests))
		}
		wantErr := map[int][2]string{
			1: {"invalid_argument", "key: invalid key: must not be empty"},
			3: {"not_found", `policy: unknown policy "nope"`},
			4: {"invalid_argument", "limit.period: invalid period: missing"},
		}
		for i, r := range rs {
			want, isErr := wantErr[i]
			switch {
			case isErr && (r.GetError().GetCode() != want[0] || !strings.Contains(r.GetError().GetMessage(), want[1])):
				t.Errorf("item %d: %v, want %s containing %q", i, r, want[0], want[1])
			case !isErr && !r.GetResponse().GetAllowed():
				t.Errorf("item %d: %v, want allowed", i, r)
			}
		}
		// Items are decided in order: "a" was spent twice.
		if got := rs[5].GetResponse().GetRemaining(); got != 3 {
			t.Errorf("second check of a: remaining %d, want 3", got)
		}
	})
	t.Run("configured maximum", func(t *testing.T) {
		ts := startServer(t, memory.New(nil, 0), Config{MaxBatch: 10}, node.Policy{Name: "configured", Limit: fiveAMinute})
		c := ts.client(t, "connect")
		res, err := c.CheckBatch(ctx, connect.NewRequest(batch(11)))
		assertError(t, res, err, connect.CodeInvalidArgument, "requests: invalid request: 11 checks; send 1 to 10")
		if _, err := c.CheckBatch(ctx, connect.NewRequest(batch(10))); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBadResets(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	c := ts.client(t, "connect")
	for _, tc := range []struct {
		req     *quotadv1.ResetRequest
		message string
	}{
		{&quotadv1.ResetRequest{Key: "k"}, "policy: invalid policy name: must not be empty"},
		{&quotadv1.ResetRequest{Policy: "a:b", Key: "k"}, "policy: invalid policy name"},
		{&quotadv1.ResetRequest{Policy: "demo"}, "key: invalid key: must not be empty"},
	} {
		res, err := c.Reset(context.Background(), connect.NewRequest(tc.req))
		assertError(t, res, err, connect.CodeInvalidArgument, tc.message)
	}
}

// A request message over MaxRequestBytes is ResourceExhausted on both
// front ends, in each transport's words: connect-go's "message size 319
// is larger than configured max 200", grpc-go's "grpc: received message
// larger than max (319 vs. 200)".
func TestMaxRequestBytes(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{MaxRequestBytes: 200})
	for protocol, want := range map[string]string{
		"connect": "larger than configured max 200",
		"grpcweb": "larger than configured max 200",
		"grpc":    "larger than max (319 vs. 200)",
	} {
		t.Run(protocol, func(t *testing.T) {
			c := ts.client(t, protocol)
			res, err := c.Check(context.Background(), connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: strings.Repeat("k", 300), Limit: fw5()}))
			assertError(t, res, err, connect.CodeResourceExhausted, want)
		})
	}
}

// A store failure the node cannot turn into a decision is Unavailable, with
// a generic message; the detail goes to the log only.
func TestInternalErrorsDoNotLeak(t *testing.T) {
	r := redistest.Start(t)
	ts := startServer(t, redisStoreOn(t, r), Config{})
	// Redis goes away: unlike Check, Reset has no failure mode to fall back on.
	r.Kill()
	res, err := ts.client(t, "connect").Reset(context.Background(), connect.NewRequest(&quotadv1.ResetRequest{Policy: "demo", Key: "k"}))
	assertError(t, res, err, connect.CodeUnavailable, "store is unavailable")
	if strings.Contains(err.Error(), "redis") {
		t.Errorf("the client sees the detail: %v", err)
	}
	if log := ts.log.String(); !strings.Contains(log, "redis") || !strings.Contains(log, "QuotaService/Reset") {
		t.Errorf("the log lacks the detail: %s", log)
	}
}

func TestCode(t *testing.T) {
	live := context.Background()
	canceled, cancel := context.WithCancel(live)
	cancel()
	expired, cancel := context.WithDeadline(live, time.Unix(0, 0))
	defer cancel()
	for _, tc := range []struct {
		ctx  context.Context
		err  error
		want connect.Code
	}{
		{live, fmt.Errorf("key: %w", node.ErrInvalidKey), connect.CodeInvalidArgument},
		{live, fmt.Errorf("limit.period: %w", algorithms.ErrInvalidPeriod), connect.CodeInvalidArgument},
		{live, fmt.Errorf("requests: %w", errInvalidRequest), connect.CodeInvalidArgument},
		{live, fmt.Errorf("limit: policy %q %w", "p", errPolicyConfigured), connect.CodeInvalidArgument},
		{live, fmt.Errorf("policy: %w", node.ErrUnknownPolicy), connect.CodeNotFound},
		{live, fmt.Errorf("limit: %w", errInlineDisabled), connect.CodePermissionDenied},
		{live, errAdminTokenWrong, connect.CodePermissionDenied},
		{live, errAdminTokenMissing, connect.CodeUnauthenticated},
		{canceled, fmt.Errorf("check p: %w", context.Canceled), connect.CodeCanceled},
		{expired, fmt.Errorf("check p: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded},
		// The store's own timeout, while the caller still waits.
		{live, fmt.Errorf("reset p: redis reset: %w", context.DeadlineExceeded), connect.CodeInternal},
		{live, fmt.Errorf("wrapped: %w", connect.NewError(connect.CodeUnavailable, errors.New("x"))), connect.CodeUnavailable},
		// A check the node shed, whatever the caller's context.
		{live, fmt.Errorf("check p: %w", node.ErrOverloaded), connect.CodeUnavailable},
		{expired, fmt.Errorf("check all: check p: %w", node.ErrOverloaded), connect.CodeUnavailable},
		{live, errors.New("redis: connection refused"), connect.CodeInternal},
		{live, fmt.Errorf("reset p: %w", node.ErrInvalidConfig), connect.CodeInternal},
	} {
		if got := code(tc.ctx, tc.err); got != tc.want {
			t.Errorf("code(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

// The recovery interceptor turns a panic into Internal and logs it.
func TestRecoverPanic(t *testing.T) {
	log := &syncBuffer{}
	const procedure = "/test.v1.Panic/Do"
	h := connect.NewUnaryHandler(procedure, func(context.Context, *connect.Request[quotadv1.ResetRequest]) (*connect.Response[quotadv1.ResetResponse], error) {
		panic("boom")
	}, recoverPanic(slogTo(log)))
	c := connect.NewClient[quotadv1.ResetRequest, quotadv1.ResetResponse](inProcessClient{h}, "http://in-process"+procedure)
	res, err := c.CallUnary(context.Background(), connect.NewRequest(&quotadv1.ResetRequest{}))
	assertError(t, res, err, connect.CodeInternal, "internal error")
	if !strings.Contains(log.String(), "boom") {
		t.Errorf("the panic was not logged: %s", log)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, bad := range []Config{{MaxBatch: -1}, {MaxBatch: 1001}, {MaxRequestBytes: -1}, {AdminToken: "two words"}, {AdminToken: "line\nbreak"}} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: got %v", bad, err)
		}
		if _, err := NewHandler(nil, bad, nil); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewHandler %+v: got %v", bad, err)
		}
	}
	for _, good := range []Config{{}, {MaxBatch: 1}, {MaxBatch: 1000, MaxRequestBytes: 1, DisableInlineLimits: true}} {
		if err := good.Validate(); err != nil {
			t.Errorf("%+v: %v", good, err)
		}
	}
	if _, err := NewHandler(nil, Config{}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil node: got %v", err)
	}
}
