package rpc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// oneSlot is an inline concurrency limit of 1 slot living a minute.
func oneSlot() *quotadv1.Limit {
	return &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_CONCURRENCY, Limit: 1, Period: durationpb.New(time.Minute)}
}

// A concurrency check returns its slot id and lifetime; renew keeps it,
// release frees it once (the second is NotFound), on both stores, over
// Connect and gRPC, inline and configured.
func TestSlotsOverTheAPI(t *testing.T) {
	gpu := node.Policy{Name: "gpu", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 1, Period: 30 * time.Second}}
	for name, mk := range stores() {
		ts := startServer(t, mk(t), Config{}, gpu)
		for _, protocol := range []string{"connect", "grpc"} {
			c := ts.client(t, protocol)
			for _, inline := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%s/inline=%v", name, protocol, inline), func(t *testing.T) {
					ctx := context.Background()
					key := protocol + fmt.Sprint(inline)
					check := &quotadv1.CheckRequest{Policy: "gpu", Key: key}
					period := 30 * time.Second
					var limit *quotadv1.Limit
					if inline {
						limit, period = oneSlot(), time.Minute
						check = &quotadv1.CheckRequest{Policy: "jobs", Key: key, Limit: limit}
					}
					res, err := c.Check(ctx, connect.NewRequest(check))
					if err != nil || !res.Msg.GetAllowed() || res.Msg.GetSlotId() == "" || res.Msg.GetSlotExpiresAfter().AsDuration() != period {
						t.Fatalf("check: %v, %v", res, err)
					}
					slot := res.Msg.GetSlotId()
					denied, err := c.Check(ctx, connect.NewRequest(check))
					if err != nil || denied.Msg.GetAllowed() || denied.Msg.GetSlotId() != "" || denied.Msg.GetSlotExpiresAfter() != nil {
						t.Fatalf("check of a full limit: %v, %v", denied, err)
					}
					renew, err := c.RenewSlot(ctx, connect.NewRequest(&quotadv1.RenewSlotRequest{Policy: check.Policy, Key: key, SlotId: slot, Limit: limit}))
					if err != nil || renew.Msg.GetExpiresAfter().AsDuration() != period || renew.Msg.GetLimit() != 1 || renew.Msg.GetRemaining() != 0 {
						t.Fatalf("renew: %v, %v", renew, err)
					}
					release := &quotadv1.ReleaseSlotRequest{Policy: check.Policy, Key: key, SlotId: slot, Limit: limit}
					rel, err := c.ReleaseSlot(ctx, connect.NewRequest(release))
					if err != nil || rel.Msg.GetRemaining() != 1 {
						t.Fatalf("release: %v, %v", rel, err)
					}
					again, err := c.ReleaseSlot(ctx, connect.NewRequest(release))
					assertError(t, again, err, connect.CodeNotFound, fmt.Sprintf("slot_id: slot not held: %q of policy %q", slot, check.Policy))
					late, err := c.RenewSlot(ctx, connect.NewRequest(&quotadv1.RenewSlotRequest{Policy: check.Policy, Key: key, SlotId: slot, Limit: limit}))
					assertError(t, late, err, connect.CodeNotFound, "slot_id: slot not held")
				})
			}
		}
	}
}

// Over HTTP/JSON, the second release of a slot is a 404 with code
// not_found.
func TestSlotsOverJSON(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	post := func(method, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(ts.URL+"/quotad.v1.QuotaService/"+method, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	limit := `"limit":{"algorithm":"ALGORITHM_CONCURRENCY","limit":"2","period":"30s"}`
	status, body := post("Check", `{"policy":"jobs","key":"k",`+limit+`}`)
	i := strings.Index(body, `"slotId":"`)
	if status != 200 || i < 0 || !strings.Contains(body, `"slotExpiresAfter":"30s"`) {
		t.Fatalf("check: %d %s", status, body)
	}
	slot := body[i+len(`"slotId":"`):]
	slot = slot[:strings.IndexByte(slot, '"')]
	release := `{"policy":"jobs","key":"k","slotId":"` + slot + `",` + limit + `}`
	if status, body := post("ReleaseSlot", release); status != 200 || !strings.Contains(body, `"remaining":"2"`) {
		t.Fatalf("release: %d %s", status, body)
	}
	if status, body := post("ReleaseSlot", release); status != 404 || !strings.Contains(body, `"code":"not_found"`) || !strings.Contains(body, "slot not held") {
		t.Fatalf("second release: %d %s", status, body)
	}
	// The slot fields are absent where there is no slot (a denial, a rate
	// limit), though the JSON codec emits every other field.
	full := `{"policy":"jobs","key":"full",` + limit + `}`
	post("Check", full)
	post("Check", full)
	if _, got := post("Check", full); !strings.Contains(got, `"allowed":false`) || strings.Contains(got, "slot") {
		t.Errorf("a denial: %s", got)
	}
	if _, got := post("Check", `{"policy":"demo","key":"k","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}`); strings.Contains(got, "slot") || !strings.Contains(got, `"retryAfter":"0s"`) {
		t.Errorf("a rate limit's response: %s", got)
	}
}

// Every bad renew or release fails with its code and a message naming the
// field.
func TestBadSlotRequests(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{}, node.Policy{Name: "configured", Limit: fiveAMinute})
	c := ts.client(t, "connect")
	ctx := context.Background()
	ia, nf := connect.CodeInvalidArgument, connect.CodeNotFound
	for _, tc := range []struct {
		name    string
		req     *quotadv1.ReleaseSlotRequest
		code    connect.Code
		message string
	}{
		{"empty slot id", &quotadv1.ReleaseSlotRequest{Policy: "jobs", Key: "k", Limit: oneSlot()}, ia, "slot_id: invalid slot id: must not be empty"},
		{"slot id over 64 bytes", &quotadv1.ReleaseSlotRequest{Policy: "jobs", Key: "k", SlotId: strings.Repeat("s", 65), Limit: oneSlot()}, ia, "slot_id: invalid slot id: 65 bytes exceeds 64"},
		{"empty key", &quotadv1.ReleaseSlotRequest{Policy: "nope", SlotId: "s"}, ia, "key: invalid key: must not be empty"},
		{"a rate limit", &quotadv1.ReleaseSlotRequest{Policy: "configured", Key: "k", SlotId: "s"}, ia, `policy: not a concurrency limit: "configured" is a fixed_window limit; only concurrency limits hold slots`},
		{"an inline rate limit", &quotadv1.ReleaseSlotRequest{Policy: "demo", Key: "k", SlotId: "s", Limit: fw5()}, ia, "policy: not a concurrency limit"},
		{"unknown policy", &quotadv1.ReleaseSlotRequest{Policy: "nope", Key: "k", SlotId: "s"}, nf, `policy: unknown policy "nope"`},
		{"inline limit on a configured policy", &quotadv1.ReleaseSlotRequest{Policy: "configured", Key: "k", SlotId: "s", Limit: oneSlot()}, ia, `limit: policy "configured" is configured on this server`},
		{"a slot never taken", &quotadv1.ReleaseSlotRequest{Policy: "jobs", Key: "k", SlotId: "s", Limit: oneSlot()}, nf, `slot_id: slot not held: "s" of policy "jobs" and this key was never taken, was already released, or has expired (a slot lives 1m0s unless renewed)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.ReleaseSlot(ctx, connect.NewRequest(tc.req))
			assertError(t, res, err, tc.code, tc.message)
			renew, err := c.RenewSlot(ctx, connect.NewRequest(&quotadv1.RenewSlotRequest{Policy: tc.req.Policy, Key: tc.req.Key, SlotId: tc.req.SlotId, Limit: tc.req.Limit}))
			assertError(t, renew, err, tc.code, tc.message)
		})
	}
	t.Run("cost 2", func(t *testing.T) {
		res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "jobs", Key: "k", Cost: proto.Int64(2), Limit: oneSlot()}))
		assertError(t, res, err, ia, "cost: invalid cost: 2; a concurrency check takes one slot (cost 1) or reports whether one is free (cost 0)")
	})
	t.Run("burst", func(t *testing.T) {
		l := oneSlot()
		l.Burst = 2
		res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "jobs", Key: "k", Limit: l}))
		assertError(t, res, err, ia, "limit.burst: invalid burst: concurrency has no burst; leave it 0")
	})
	t.Run("over a million slots", func(t *testing.T) {
		l := oneSlot()
		l.Limit = algorithms.MaxConcurrencySlots + 1
		res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "jobs", Key: "k", Limit: l}))
		assertError(t, res, err, ia, "limit.limit: invalid limit: concurrency stores one entry per held slot and allows at most 1000000, got 1000001")
	})
	if got := code(ctx, fmt.Errorf("slot_id: %w", node.ErrSlotNotHeld)); got != nf {
		t.Errorf("code(ErrSlotNotHeld) = %s, want NotFound", got)
	}
}
