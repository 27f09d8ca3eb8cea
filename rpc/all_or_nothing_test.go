package rpc

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// CheckBatch with all_or_nothing over the wire: the batch is allowed whole
// or spends nothing, and a bad item fails the whole call.
func TestCheckBatchAllOrNothing(t *testing.T) {
	for name, store := range stores() {
		t.Run(name, func(t *testing.T) {
			ts := startServer(t, store(t), Config{},
				node.Policy{Name: "per-user", Limit: fiveAYear},
				node.Policy{Name: "per-tenant", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 3, Period: time.Hour}},
				node.Policy{Name: "jobs", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1, Period: time.Minute}})
			c := ts.client(t, "connect")
			ctx := context.Background()
			batch := func(reqs ...*quotadv1.CheckRequest) *connect.Request[quotadv1.CheckBatchRequest] {
				return connect.NewRequest(&quotadv1.CheckBatchRequest{AllOrNothing: true, Requests: reqs})
			}
			user := &quotadv1.CheckRequest{Policy: "per-user", Key: "u1"}
			tenant := &quotadv1.CheckRequest{Policy: "per-tenant", Key: "t1"}
			remaining := func(policy, key string) int64 {
				t.Helper()
				res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: policy, Key: key, Cost: new(int64)}))
				if err != nil {
					t.Fatal(err)
				}
				return res.Msg.GetRemaining()
			}

			// Three fit; the fourth is over the tenant's limit and spends
			// nothing of the user's.
			for i := range 4 {
				res, err := c.CheckBatch(ctx, batch(user, tenant))
				if err != nil {
					t.Fatal(err)
				}
				u, tn := res.Msg.GetResults()[0].GetResponse(), res.Msg.GetResults()[1].GetResponse()
				if i < 3 {
					if !u.GetAllowed() || !tn.GetAllowed() || u.GetRemaining() != int64(4-i) || tn.GetRemaining() != int64(2-i) {
						t.Fatalf("batch %d: %v, %v", i+1, u, tn)
					}
					continue
				}
				if u.GetAllowed() || tn.GetAllowed() || u.GetRetryAfter().AsDuration() != 0 || tn.GetRetryAfter().AsDuration() <= 0 || u.GetRemaining() != 2 {
					t.Fatalf("batch 4: user %v, tenant %v; want both denied, the tenant with a retry_after, the user with 2 remaining", u, tn)
				}
			}
			if r := remaining("per-user", "u1"); r != 2 {
				t.Fatalf("per-user: %d remaining, want 2", r)
			}

			// Over HTTP/JSON, the field is allOrNothing.
			status, body := postJSON(t, http1Client(t), ts.URL, "/quotad.v1.QuotaService/CheckBatch", "application/json",
				`{"allOrNothing":true,"requests":[{"policy":"per-user","key":"u2"},{"policy":"per-tenant","key":"t1"}]}`)
			if status != http.StatusOK || strings.Count(body, `"allowed":false`) != 2 {
				t.Fatalf("JSON: %d %s", status, body)
			}
			if r := remaining("per-user", "u2"); r != 5 {
				t.Fatalf("per-user u2: %d remaining after a denied JSON batch, want 5", r)
			}

			// A bad item fails the whole call with its own code, and
			// nothing is decided.
			for _, tc := range []struct {
				name    string
				reqs    []*quotadv1.CheckRequest
				code    connect.Code
				message string
			}{
				{"empty key", []*quotadv1.CheckRequest{{Policy: "per-user", Key: "u3"}, {Policy: "per-user", Key: ""}},
					connect.CodeInvalidArgument, "requests[1]: key: invalid key: must not be empty"},
				{"unknown policy", []*quotadv1.CheckRequest{{Policy: "nope", Key: "u3"}, {Policy: "per-user", Key: "u3"}},
					connect.CodeNotFound, `requests[0]: policy: unknown policy "nope"`},
				{"costs of one key add up past the limit", []*quotadv1.CheckRequest{{Policy: "per-user", Key: "u3", Cost: cost(3)}, {Policy: "per-user", Key: "u3", Cost: cost(3)}},
					connect.CodeInvalidArgument, "requests[1]: cost: invalid cost: with the earlier checks of policy per-user and this key, 6 in all exceeds what the limit can ever admit (5)"},
				{"a concurrency limit", []*quotadv1.CheckRequest{{Policy: "per-user", Key: "u3"}, {Policy: "jobs", Key: "u3"}},
					connect.CodeInvalidArgument, "requests[1]: policy jobs: a concurrency limit cannot be part of an all-or-nothing batch; check it with Check"},
			} {
				res, err := c.CheckBatch(ctx, batch(tc.reqs...))
				assertError(t, res, err, tc.code, tc.message)
			}
			if r := remaining("per-user", "u3"); r != 5 {
				t.Fatalf("per-user u3: %d remaining after refused batches, want 5", r)
			}
			if r := remaining("jobs", "u3"); r != 1 {
				t.Fatalf("jobs u3: %d slots free after a refused batch, want 1", r)
			}
		})
	}
}

func cost(c int64) *int64 { return &c }

// fiveAYear: no window ends while a test runs.
var fiveAYear = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: algorithms.MaxPeriod}
