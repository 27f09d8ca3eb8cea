package rpc

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// AcquireLease grants units on Redis and ReturnLease gives them back once;
// bad lease requests get their codes (docs/errors.md).
func TestLeasesOverTheAPI(t *testing.T) {
	big := node.Policy{Name: "big", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10_000, Period: time.Hour}}
	ts := startServer(t, redisStore(t), Config{}, big)
	c := ts.client(t, "connect")
	ctx := context.Background()

	res, err := c.AcquireLease(ctx, connect.NewRequest(&quotadv1.AcquireLeaseRequest{Policy: "big", Key: "k", Want: 100}))
	if err != nil {
		t.Fatal(err)
	}
	m := res.Msg
	// 5 % of 10,000 on one node: up to 500, so all 100 wanted.
	if !m.GetDecision().GetAllowed() || m.GetUnits() != 100 || m.GetLeaseId() == "" || m.GetUseWithin().AsDuration() <= 0 {
		t.Fatalf("AcquireLease: %v", m)
	}
	if got := m.GetDecision().GetRemaining(); got != 10_000-1 {
		t.Errorf("remaining %d, want 9999 (what Redis has left plus what the client holds)", got)
	}
	ret, err := c.ReturnLease(ctx, connect.NewRequest(&quotadv1.ReturnLeaseRequest{LeaseId: m.GetLeaseId(), Units: 60}))
	if err != nil || ret.Msg.GetReturned() != 60 {
		t.Fatalf("ReturnLease: %v %v", ret, err)
	}
	again, err := c.ReturnLease(ctx, connect.NewRequest(&quotadv1.ReturnLeaseRequest{LeaseId: m.GetLeaseId(), Units: 40}))
	assertError(t, again, err, connect.CodeNotFound, "lease id: lease not held: ")

	ia := connect.CodeInvalidArgument
	for _, tc := range []struct {
		name    string
		req     *quotadv1.AcquireLeaseRequest
		code    connect.Code
		message string
	}{
		{"negative want", &quotadv1.AcquireLeaseRequest{Policy: "big", Key: "k", Want: -1}, ia, "want: invalid lease request: -1 must not be negative"},
		{"a concurrency limit", &quotadv1.AcquireLeaseRequest{Policy: "jobs", Key: "k", Want: 10, Limit: oneSlot()}, ia, "policy jobs: a concurrency limit cannot be leased; check it with Check"},
		{"empty key", &quotadv1.AcquireLeaseRequest{Policy: "big", Want: 10}, ia, "key: invalid key: must not be empty"},
		{"unknown policy", &quotadv1.AcquireLeaseRequest{Policy: "nope", Key: "k", Want: 10}, connect.CodeNotFound, `policy: unknown policy "nope"`},
		{"cost above the capacity", &quotadv1.AcquireLeaseRequest{Policy: "big", Key: "k", Cost: proto.Int64(10_001)}, ia, "cost: invalid cost"},
		{"negative previous kept", &quotadv1.AcquireLeaseRequest{Policy: "big", Key: "k", Want: 10, PreviousLeaseId: "x", PreviousKept: -1}, ia, "previous kept: invalid lease request: -1 must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.AcquireLease(ctx, connect.NewRequest(tc.req))
			assertError(t, res, err, tc.code, tc.message)
		})
	}
	for _, tc := range []struct {
		name    string
		req     *quotadv1.ReturnLeaseRequest
		code    connect.Code
		message string
	}{
		{"empty lease id", &quotadv1.ReturnLeaseRequest{}, ia, "lease id: invalid lease request: 0 bytes (want 1 to 64)"},
		{"lease id over 64 bytes", &quotadv1.ReturnLeaseRequest{LeaseId: strings.Repeat("x", 65)}, ia, "lease id: invalid lease request: 65 bytes (want 1 to 64)"},
		{"negative units", &quotadv1.ReturnLeaseRequest{LeaseId: "x", Units: -1}, ia, "units: invalid lease request: -1 must not be negative"},
		{"a lease never granted", &quotadv1.ReturnLeaseRequest{LeaseId: "x", Units: 1}, connect.CodeNotFound, `lease id: lease not held: "x" was not granted by this node, was returned already, or expired more than 1s ago`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.ReturnLease(ctx, connect.NewRequest(tc.req))
			assertError(t, res, err, tc.code, tc.message)
		})
	}
}

// A lease taken ahead of need retires the previous one (previous_kept):
// the previous no longer counts against the cap, stays open for one later
// return of at most previous_kept units, and the new lease's own check is
// part of its units. Redis then counts exactly what the client spent.
func TestLeaseRetiredAhead(t *testing.T) {
	big := node.Policy{Name: "big", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10_000, Period: time.Hour}}
	ts := startServer(t, redisStore(t), Config{}, big)
	c := ts.client(t, "connect")
	ctx := context.Background()
	window := time.Now().Truncate(time.Hour)

	// 5 % of 10,000 on one node: a cap of 500.
	a, err := c.AcquireLease(ctx, connect.NewRequest(&quotadv1.AcquireLeaseRequest{Policy: "big", Key: "k", Want: 400}))
	if err != nil || a.Msg.GetUnits() != 400 {
		t.Fatalf("first AcquireLease: %v %v", a, err)
	}
	// The client spent 370 of A's units and keeps spending the last 30.
	b, err := c.AcquireLease(ctx, connect.NewRequest(&quotadv1.AcquireLeaseRequest{
		Policy: "big", Key: "k", Want: 400, PreviousLeaseId: a.Msg.GetLeaseId(), PreviousKept: 30,
	}))
	if err != nil {
		t.Fatal(err)
	}
	// Were A still counted, only 100 would fit under the cap.
	if got := b.Msg.GetUnits(); got != 401 {
		t.Fatalf("AcquireLease ahead: %d units, want 401 (400 wanted, A retired, plus the call's own check)", got)
	}
	ret, err := c.ReturnLease(ctx, connect.NewRequest(&quotadv1.ReturnLeaseRequest{LeaseId: a.Msg.GetLeaseId(), Units: 100}))
	if err != nil || ret.Msg.GetReturned() != 30 {
		t.Fatalf("ReturnLease of the retired lease: %v %v (want 30: at most what was kept)", ret, err)
	}
	// The client spent 1 of B's units.
	ret, err = c.ReturnLease(ctx, connect.NewRequest(&quotadv1.ReturnLeaseRequest{LeaseId: b.Msg.GetLeaseId(), Units: 400}))
	if err != nil || ret.Msg.GetReturned() != 400 {
		t.Fatalf("ReturnLease of the new lease: %v %v", ret, err)
	}
	look, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "big", Key: "k", Cost: proto.Int64(0)}))
	if err != nil {
		t.Fatal(err)
	}
	if time.Now().Truncate(time.Hour) != window {
		t.Skip("the hour turned during the test")
	}
	// Spent: A's check, 370 of A, 1 of B.
	if got := look.Msg.GetRemaining(); got != 10_000-372 {
		t.Errorf("remaining %d, want %d", got, 10_000-372)
	}

	// With the cap full, a lease ahead of need is its own check's unit.
	full, err := c.AcquireLease(ctx, connect.NewRequest(&quotadv1.AcquireLeaseRequest{Policy: "big", Key: "k2", Want: 500}))
	if err != nil || full.Msg.GetUnits() != 500 {
		t.Fatalf("AcquireLease of the whole cap: %v %v", full, err)
	}
	one, err := c.AcquireLease(ctx, connect.NewRequest(&quotadv1.AcquireLeaseRequest{
		Policy: "big", Key: "k2", Want: 100, PreviousLeaseId: "gone", PreviousKept: 5,
	}))
	if err != nil || one.Msg.GetUnits() != 1 || one.Msg.GetLeaseId() == "" {
		t.Fatalf("AcquireLease ahead with the cap full: %v %v (want a lease of 1 unit)", one, err)
	}
	ret, err = c.ReturnLease(ctx, connect.NewRequest(&quotadv1.ReturnLeaseRequest{LeaseId: one.Msg.GetLeaseId(), Units: 1}))
	if err != nil || ret.Msg.GetReturned() != 1 {
		t.Fatalf("ReturnLease of the one unit: %v %v", ret, err)
	}
}

// GET /status shows the client leases the node granted, returned and
// holds, for the console.
func TestStatusShowsClientLeases(t *testing.T) {
	big := node.Policy{Name: "big", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10_000, Period: time.Hour}}
	ts := startServer(t, redisStore(t), Config{}, big)
	c := ts.client(t, "connect")
	ctx := context.Background()
	var ids []string
	for _, want := range []int64{100, 50} {
		res, err := c.AcquireLease(ctx, connect.NewRequest(&quotadv1.AcquireLeaseRequest{Policy: "big", Key: "k" + strconv.FormatInt(want, 10), Want: want}))
		if err != nil || res.Msg.GetUnits() != want {
			t.Fatalf("AcquireLease: %v %v", res, err)
		}
		ids = append(ids, res.Msg.GetLeaseId())
	}
	if _, err := c.ReturnLease(ctx, connect.NewRequest(&quotadv1.ReturnLeaseRequest{LeaseId: ids[0], Units: 60})); err != nil {
		t.Fatal(err)
	}
	got := getStatus(t, ts.URL).ClientLeases
	if want := (clientLeasesJSON{Granted: 2, UnitsLeased: 150, UnitsReturned: 60, Outstanding: 1, UnitsHeld: 50}); got != want {
		t.Errorf("client_leases %+v, want %+v", got, want)
	}
}

// With client leases off, AcquireLease is a check: decided, counted at the
// store, no units granted.
func TestClientLeasesOff(t *testing.T) {
	big := node.Policy{Name: "big", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10_000, Period: time.Hour}}
	ts := startServer(t, redisStore(t), Config{DisableClientLeases: true}, big)
	c := ts.client(t, "grpc")
	res, err := c.AcquireLease(context.Background(), connect.NewRequest(&quotadv1.AcquireLeaseRequest{Policy: "big", Key: "k", Want: 100}))
	if err != nil {
		t.Fatal(err)
	}
	m := res.Msg
	if !m.GetDecision().GetAllowed() || m.GetUnits() != 0 || m.GetLeaseId() != "" || m.GetDecision().GetRemaining() != 10_000-1 {
		t.Fatalf("AcquireLease with client leases off: %v, want the check alone (allowed, remaining 9999, no units)", m)
	}
}
