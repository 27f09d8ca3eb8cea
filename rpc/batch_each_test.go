package rpc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
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

// bulkRecorder counts the store calls made with and without
// node.AcquireRequest.Bulk.
type bulkRecorder struct {
	node.Store
	mu   sync.Mutex
	bulk map[bool]int
}

func (s *bulkRecorder) Acquire(ctx context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	s.mu.Lock()
	s.bulk[r.Bulk]++
	s.mu.Unlock()
	return s.Store.Acquire(ctx, r)
}

func (s *bulkRecorder) counts() (single, bulk int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bulk[false], s.bulk[true]
}

// A CheckBatch's items reach the store as bulk calls
// (node.AcquireRequest.Bulk), in either mode, so that a store can keep
// them from holding back single checks; a Check's call is not bulk.
func TestCheckBatchItemsAreBulkStoreCalls(t *testing.T) {
	store := &bulkRecorder{Store: memory.New(nil, 0), bulk: map[bool]int{}}
	ts := startServer(t, store, Config{}, node.Policy{Name: "five", Limit: fiveAMinute})
	c := ts.client(t, "connect")
	if _, err := c.Check(context.Background(), connect.NewRequest(&quotadv1.CheckRequest{Policy: "five", Key: "single"})); err != nil {
		t.Fatal(err)
	}
	if single, bulk := store.counts(); single != 1 || bulk != 0 {
		t.Fatalf("after a Check: %d single and %d bulk store calls, want 1 and 0", single, bulk)
	}
	for _, allOrNothing := range []bool{false, true} {
		req := &quotadv1.CheckBatchRequest{AllOrNothing: allOrNothing}
		for i := range 3 {
			req.Requests = append(req.Requests, &quotadv1.CheckRequest{Policy: "five", Key: fmt.Sprint("item", i)})
		}
		if _, err := c.CheckBatch(context.Background(), connect.NewRequest(req)); err != nil {
			t.Fatal(err)
		}
	}
	if single, bulk := store.counts(); single != 1 || bulk != 6 {
		t.Fatalf("after two CheckBatches of 3: %d single and %d bulk store calls, want 1 and 6", single, bulk)
	}
}
