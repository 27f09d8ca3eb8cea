package rpc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// A CheckBatch decides its items concurrently, but the items of one policy
// and key in request order, as they would be decided alone: on Redis, 100
// items over 10 keys of a limit of 5, each key's first five allowed, the
// rest denied, and every result in its item's place.
func TestCheckBatchKeepsEachKeysOrder(t *testing.T) {
	ts := startServer(t, redisStore(t), Config{}, node.Policy{Name: "five", Limit: fiveAMinute})
	quotadtest.AwayFromWindowEnd(t, time.Minute, 5*time.Second)
	c := ts.client(t, "connect")
	req := &quotadv1.CheckBatchRequest{}
	for i := range 100 {
		req.Requests = append(req.Requests, &quotadv1.CheckRequest{Policy: "five", Key: fmt.Sprint("k", i%10)})
	}
	res, err := c.CheckBatch(context.Background(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res.Msg.GetResults() {
		d := r.GetResponse()
		if want := i < 50; d.GetAllowed() != want {
			t.Errorf("item %d (key k%d, its %d. check): allowed %v, want %v", i, i%10, i/10+1, d.GetAllowed(), want)
		}
		if want := int64(max(0, 4-i/10)); d.GetAllowed() && d.GetRemaining() != want {
			t.Errorf("item %d: remaining %d, want %d", i, d.GetRemaining(), want)
		}
	}
}
