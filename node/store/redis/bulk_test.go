package redis

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
)

// A batch's items (node.AcquireRequest.Bulk) go through a pipeline of their own: a
// single check never queues behind them, nor rides in their round trips.
func TestBulkChecksGoThroughTheirOwnPipeline(t *testing.T) {
	r := redistest.Start(t)
	s, err := New(context.Background(), Config{URL: r.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Minute}
	trips := func() (check, bulk int64) { return s.checkPipe.roundTrips.Load(), s.bulkPipe.roundTrips.Load() }

	check0, bulk0 := trips()
	if _, _, err := s.Acquire(context.Background(), node.AcquireRequest{Base: "{item}", Limit: l, Cost: 1, Want: 1, Bulk: true}); err != nil {
		t.Fatal(err)
	}
	check1, bulk1 := trips()
	if check1 != check0 || bulk1 != bulk0+1 {
		t.Fatalf("a batch item's check made %d round trips on the check pipeline and %d on the bulk one, want 0 and 1", check1-check0, bulk1-bulk0)
	}
	if _, _, err := s.Acquire(context.Background(), node.AcquireRequest{Base: "{single}", Limit: l, Cost: 1, Want: 1}); err != nil {
		t.Fatal(err)
	}
	check2, bulk2 := trips()
	if check2 != check1+1 || bulk2 != bulk1 {
		t.Fatalf("a single check made %d round trips on the check pipeline and %d on the bulk one, want 1 and 0", check2-check1, bulk2-bulk1)
	}
	// Both count in the store's totals.
	if got := s.RoundTrips(); got < 2 {
		t.Fatalf("RoundTrips %d, want at least the 2 made", got)
	}
}

// BenchmarkSingleCheckBesideBatchFlood measures single checks' latency on
// a store that a CheckBatch-like flood keeps busy: 64 goroutines checking
// new 1 KiB keys as fast as Redis answers, the way the items of a
// CheckBatch of cold keys do (node.BatchParallel). "shared": the flood's
// calls are not marked bulk, so they share the single checks' pipeline, as
// they did before the bulk pipeline; "bulk": they are
// (node.AcquireRequest.Bulk), as
// a CheckBatch's are. Each op is one single check, back to back:
//
//	go test -run '^$' -bench SingleCheckBesideBatchFlood -benchtime 2000x ./node/store/redis
func BenchmarkSingleCheckBesideBatchFlood(b *testing.B) {
	r := redistest.Start(b)
	s, err := New(context.Background(), Config{URL: r.URL(), Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1 << 40, Period: time.Hour}
	pad := strings.Repeat("x", 1000)
	for _, mode := range []string{"shared", "bulk"} {
		b.Run(mode, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			bulk := mode == "bulk"
			var wg sync.WaitGroup
			var flood atomic.Int64
			for w := range 64 {
				wg.Go(func() {
					for i := 0; ctx.Err() == nil; i++ {
						_, _, _ = s.Acquire(ctx, node.AcquireRequest{Base: fmt.Sprintf("{%s-%d-%d-%s}", mode, w, i, pad), Limit: l, Cost: 1, Want: 1, Bulk: bulk})
						flood.Add(1)
					}
				})
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				if _, _, err := s.Acquire(context.Background(), node.AcquireRequest{Base: "{single}", Limit: l, Cost: 1, Want: 1}); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			elapsed := b.Elapsed()
			cancel()
			wg.Wait()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(flood.Load())/elapsed.Seconds(), "flood-calls/s")
		})
	}
}
