package rpc

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

const demoJSON = `{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}`

// postJSON posts body to procedure as curl would and returns the status and
// body of the answer.
func postJSON(t *testing.T, c *http.Client, url, procedure, contentType, body string) (int, string) {
	t.Helper()
	res, err := c.Post(url+procedure, contentType, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// The curl path: Connect's HTTP/JSON. Five allowed, the sixth denied, and
// the denial spells out every field, zeros included.
func TestJSONCheck(t *testing.T) {
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			ts := startServer(t, store(t), Config{})
			c := http1Client(t)
			// demo is 5 per minute in a fixed window: the eight checks
			// must land in one window.
			quotadtest.AwayFromWindowEnd(t, time.Minute, 15*time.Second)
			for i := range 5 {
				status, body := postJSON(t, c, ts.URL, "/quotad.v1.QuotaService/Check", "application/json", demoJSON)
				if status != http.StatusOK || !strings.Contains(body, `"allowed":true`) || !strings.Contains(body, `"retryAfter":"0s"`) {
					t.Fatalf("check %d: %d %s", i+1, status, body)
				}
			}
			// connect-go has a codec for each content type; all must use ours.
			for i, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON; Charset=UTF-8"} {
				status, body := postJSON(t, c, ts.URL, "/quotad.v1.QuotaService/Check", ct, demoJSON)
				if status != http.StatusOK {
					t.Fatalf("denied check (%s): %d %s", ct, status, body)
				}
				// The first denial comes from the store; on Redis the node
				// remembers it and answers the next ones itself.
				source := `"source":"SOURCE_STORE"`
				if i > 0 && name == "redis" {
					source = `"source":"SOURCE_DENIED_CACHE"`
				}
				for _, want := range []string{`"allowed":false`, `"limit":"5"`, `"remaining":"0"`, source} {
					if !strings.Contains(body, want) {
						t.Errorf("denied check (%s): body %s lacks %s", ct, body, want)
					}
				}
				var res struct {
					RetryAfter string `json:"retryAfter"`
					ResetAfter string `json:"resetAfter"`
				}
				if err := json.Unmarshal([]byte(body), &res); err != nil {
					t.Fatal(err)
				}
				retry, err := time.ParseDuration(res.RetryAfter)
				if err != nil || retry <= 0 || retry > time.Minute {
					t.Errorf("denied check (%s): retryAfter %q, want in (0, 60s]", ct, res.RetryAfter)
				}
				if _, err := time.ParseDuration(res.ResetAfter); err != nil {
					t.Errorf("denied check (%s): resetAfter %q: %v", ct, res.ResetAfter, err)
				}
			}
		})
	}
}

// JSON requests are strict: unknown fields and bad enum names are
// InvalidArgument, as are unknown enum numbers (by the handler's checks).
func TestJSONRejectsMalformedRequests(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	c := http1Client(t)
	for name, tc := range map[string]struct{ body, wantInMessage string }{
		"unknown field": {`{"policy":"demo","key":"u1","cots":3,"limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}`, "cots"},
		"bad enum name": {`{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_NOPE","limit":"5","period":"60s"}}`, "ALGORITHM_NOPE"},
		"enum number":   {`{"policy":"demo","key":"u1","limit":{"algorithm":99,"limit":"5","period":"60s"}}`, "limit.algorithm"},
		"bad duration":  {`{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"sixty"}}`, `limit.period: want a duration such as "60s" (seconds), "1m" or "500ms", or a number of seconds; got "sixty"`},
		"not JSON":      {`policy=demo`, "unmarshal"},
		"empty body":    {``, "{}"},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := postJSON(t, c, ts.URL, "/quotad.v1.QuotaService/Check", "application/json", tc.body)
			var e struct{ Code, Message string }
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%d %s: %v", status, body, err)
			}
			if status != http.StatusBadRequest || e.Code != "invalid_argument" || !strings.Contains(e.Message, tc.wantInMessage) {
				t.Fatalf("got %d %s, want 400 invalid_argument naming %q", status, body, tc.wantInMessage)
			}
		})
	}
}

// The same check through the generated client over each protocol: Connect
// (binary), gRPC over HTTP/2 cleartext (served by grpc-go), and gRPC-Web.
func TestProtocols(t *testing.T) {
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			ts := startServer(t, store(t), Config{})
			for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
				t.Run(protocol, func(t *testing.T) {
					ctx := context.Background()
					c := ts.client(t, protocol)
					served := ts.httpRequests.Load()
					req := &quotadv1.CheckRequest{
						Policy: "demo",
						Key:    "u-" + protocol,
						Limit:  &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_FIXED_WINDOW, Limit: 5, Period: durationpb.New(time.Minute)},
					}
					for i := range 5 {
						res, err := c.Check(ctx, connect.NewRequest(req))
						if err != nil || !res.Msg.GetAllowed() || res.Msg.GetRemaining() != int64(4-i) {
							t.Fatalf("check %d: %v, %v", i+1, res, err)
						}
					}
					res, err := c.Check(ctx, connect.NewRequest(req))
					if err != nil {
						t.Fatal(err)
					}
					m := res.Msg
					if m.GetAllowed() || m.GetLimit() != 5 || m.GetRemaining() != 0 || m.GetSource() != quotadv1.Source_SOURCE_STORE ||
						m.GetRetryAfter().AsDuration() <= 0 || m.GetRetryAfter().AsDuration() > time.Minute {
						t.Fatalf("sixth check: %v", m)
					}
					// gRPC runs on grpc-go's transport; the others on
					// net/http, over HTTP/1.1.
					switch got := ts.httpRequests.Load() - served; {
					case protocol == "grpc" && got != 0:
						t.Errorf("the HTTP front end served %d gRPC checks, want grpc-go to serve them all", got)
					case protocol != "grpc" && (got != 6 || ts.lastProto.Load() != 1):
						t.Errorf("the HTTP front end served %d checks, the last over HTTP/%d; want 6 over HTTP/1", got, ts.lastProto.Load())
					}
				})
			}
		})
	}
}

// Cost: omitted spends 1, 0 spends nothing and reports, n spends n.
func TestCost(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, node.Policy{Name: "demo", Limit: fiveAMinute})
	c := ts.client(t, "connect")
	check := func(cost *int64) *quotadv1.CheckResponse {
		t.Helper()
		res, err := c.Check(context.Background(), connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "k", Cost: cost}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg
	}
	if m := check(nil); !m.GetAllowed() || m.GetRemaining() != 4 {
		t.Fatalf("omitted cost: %v", m)
	}
	if m := check(proto.Int64(0)); !m.GetAllowed() || m.GetRemaining() != 4 {
		t.Fatalf("cost 0: %v", m)
	}
	if m := check(proto.Int64(3)); !m.GetAllowed() || m.GetRemaining() != 1 {
		t.Fatalf("cost 3: %v", m)
	}
	if m := check(proto.Int64(2)); m.GetAllowed() || m.GetRemaining() != 1 {
		t.Fatalf("cost 2 with 1 left: %v", m)
	}
}

// ListPolicies returns every configured policy with all its fields; Reset
// makes a denied key allowed again.
func TestListPoliciesAndReset(t *testing.T) {
	policies := []node.Policy{
		{Name: "demo", Limit: fiveAMinute},
		{Name: "api.burst", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Second, Burst: 20}, OnStoreError: node.FailClosed},
		{Name: "login", Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 3, Period: 15 * time.Minute}, OnStoreError: node.FailOpen},
	}
	want := []*quotadv1.Policy{
		{Name: "api.burst", Limit: &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_TOKEN_BUCKET, Limit: 10, Period: durationpb.New(time.Second), Burst: 20, OnStoreError: quotadv1.FailureMode_FAILURE_MODE_CLOSED}},
		// The node resolves an unset failure mode to its default (open).
		{Name: "demo", Limit: &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_FIXED_WINDOW, Limit: 5, Period: durationpb.New(time.Minute), OnStoreError: quotadv1.FailureMode_FAILURE_MODE_OPEN}},
		{Name: "login", Limit: &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_SLIDING_WINDOW_LOG, Limit: 3, Period: durationpb.New(15 * time.Minute), OnStoreError: quotadv1.FailureMode_FAILURE_MODE_OPEN}},
	}
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			ts := startServer(t, store(t), Config{}, policies...)
			c := ts.client(t, "grpc")
			ctx := context.Background()

			res, err := c.ListPolicies(ctx, connect.NewRequest(&quotadv1.ListPoliciesRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			got := res.Msg.GetPolicies()
			if len(got) != len(want) {
				t.Fatalf("got %d policies, want %d: %v", len(got), len(want), got)
			}
			for i := range want {
				if !proto.Equal(got[i], want[i]) {
					t.Errorf("policy %d: got %v, want %v", i, got[i], want[i])
				}
			}

			check := connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "u1", Cost: proto.Int64(5)})
			if res, err := c.Check(ctx, check); err != nil || !res.Msg.GetAllowed() {
				t.Fatalf("first check: %v, %v", res, err)
			}
			if res, err := c.Check(ctx, check); err != nil || res.Msg.GetAllowed() {
				t.Fatalf("second check should be denied: %v, %v", res, err)
			}
			if _, err := c.Reset(ctx, connect.NewRequest(&quotadv1.ResetRequest{Policy: "demo", Key: "u1"})); err != nil {
				t.Fatal(err)
			}
			if res, err := c.Check(ctx, check); err != nil || !res.Msg.GetAllowed() || res.Msg.GetRemaining() != 0 {
				t.Fatalf("after reset: %v, %v", res, err)
			}
		})
	}
}

// ListPolicies over JSON shows every field, so a client sees the
// resolved failure mode and zero burst rather than their absence.
func TestJSONListPoliciesShowsEveryField(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, node.Policy{Name: "demo", Limit: fiveAMinute})
	status, body := postJSON(t, http1Client(t), ts.URL, "/quotad.v1.QuotaService/ListPolicies", "application/json", `{}`)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	for _, want := range []string{`"name":"demo"`, `"algorithm":"ALGORITHM_FIXED_WINDOW"`, `"limit":"5"`, `"period":"60s"`, `"burst":"0"`, `"onStoreError":"FAILURE_MODE_OPEN"`} {
		if !strings.Contains(body, want) {
			t.Errorf("body %s lacks %s", body, want)
		}
	}
}
