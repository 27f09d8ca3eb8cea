package main

import (
	"context"
	"net/http"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/quotad/quotad/internal/redistest"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// A client that chains AcquireLease calls, each retiring the whole of the
// lease before it (previous_kept equal to its units), cannot take the
// limit: a retired lease keeps at most half of its units, and those go on
// counting against the node's lease share until the lease expires. What
// the client holds at once stays within the share; what it claims to have
// spent in between (the other half of each lease) makes the chain's total
// a geometric series, share + share/2 + ..., under twice the share. The
// limit's other holders still find most of it.
func TestChainedRetiredLeasesCannotHoardTheLimit(t *testing.T) {
	const (
		limit = 30_000
		// lease.max_fraction (5 %) of the limit on a one-node cluster.
		share = limit / 20
		calls = 61
	)
	r := redistest.Start(t)
	cfg := writeFile(t, "q.yaml", "policies:\n  - name: hoard\n    algorithm: fixed_window\n    limit: 30000\n    period: 1h\n")
	p := startProcess(t, "--config", cfg, "--redis", r.URL())
	c := quotadv1connect.NewQuotaServiceClient(http.DefaultClient, p.URL)
	ctx := context.Background()

	var held, prevUnits int64
	var prevID string
	for i := range calls {
		res, err := c.AcquireLease(ctx, connect.NewRequest(&quotadv1.AcquireLeaseRequest{
			Policy: "hoard", Key: "k", Want: limit,
			PreviousLeaseId: prevID, PreviousKept: prevUnits,
		}))
		if err != nil {
			t.Fatalf("AcquireLease %d: %v", i, err)
		}
		held += res.Msg.GetUnits()
		if id := res.Msg.GetLeaseId(); id != "" {
			prevID, prevUnits = id, res.Msg.GetUnits()
		}
	}
	// Each call may add its own check's unit when it asks ahead of need:
	// it is a check of the client's, counted as one.
	if held > 2*share+calls {
		t.Fatalf("%d chained leases retiring the whole of the last took %d units, want under twice the share %d plus one unit per call (%d)",
			calls, held, share, 2*share+calls)
	}

	// What is left at Redis: everything the chain did not take.
	look, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "hoard", Key: "k", Cost: proto.Int64(0)}))
	if err != nil {
		t.Fatal(err)
	}
	if got := look.Msg.GetRemaining(); got < limit-2*share-calls {
		t.Fatalf("remaining %d after the chain, want at least %d", got, limit-2*share-calls)
	}
	other, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "hoard", Key: "k"}))
	if err != nil || !other.Msg.GetAllowed() {
		t.Fatalf("another caller's check after the chain: %v, %v; want allowed", other, err)
	}
	t.Logf("%d chained AcquireLease calls held %d units (share %d); remaining at Redis %d", calls, held, share, look.Msg.GetRemaining())
}
