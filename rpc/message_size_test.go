package rpc

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// Every call but the batches is bounded at MaxCallRequestBytes whatever
// MaxRequestBytes allows, compressed or not, on every protocol; a
// CheckBatch of the same size is within MaxRequestBytes and decided.
func TestMaxCallRequestBytes(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	ctx := context.Background()
	big := strings.Repeat("k", MaxCallRequestBytes)
	for _, proto := range []string{"connect", "grpc", "grpcweb"} {
		c := ts.client(t, proto)
		res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: big, Limit: fw5()}))
		assertError(t, res, err, connect.CodeResourceExhausted, "larger than configured max 65536")
		reset, err := c.Reset(ctx, connect.NewRequest(&quotadv1.ResetRequest{Policy: "demo", Key: big}))
		assertError(t, reset, err, connect.CodeResourceExhausted, "larger than configured max 65536")
		// 100 checks of 1 KiB keys: 100 KB, over the calls' bound.
		batch := &quotadv1.CheckBatchRequest{}
		for i := range 100 {
			batch.Requests = append(batch.Requests, &quotadv1.CheckRequest{Policy: "demo", Key: strings.Repeat(string(rune('a'+i%26)), 1024), Limit: fw5()})
		}
		if res, err := c.CheckBatch(ctx, connect.NewRequest(batch)); err != nil || len(res.Msg.GetResults()) != 100 {
			t.Fatalf("%s: a batch of 100 KB: %v, %v", proto, res, err)
		}
	}

	// A JSON Check compressed to a few KiB that inflates to 1 MiB stops
	// inflating just past the calls' bound.
	status, raw := postGzippedCheck(t, ts.URL, 1<<20)
	if status != http.StatusTooManyRequests || !strings.Contains(raw, "gzip: stopped inflating after 65537 bytes") {
		t.Fatalf("%d %s", status, raw)
	}
}
