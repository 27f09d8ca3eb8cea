package rpc

import (
	"bytes"
	"context"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// BenchmarkCheckBesideGzipBombs times single Checks (Connect, HTTP/1.1)
// on a node with one processor (GOMAXPROCS 1) while two clients post gzip
// bombs as CheckBatches: 1 MiB members, so that their trailer does not
// refuse them and each inflates to the 2 MiB bound. With the decompressor
// yielding every gzipYieldEvery bytes and without (yield=false): p99-µs
// is the Checks' 99th percentile, bombs/s how many bombs were refused a
// second. Client and server share the one processor.
func BenchmarkCheckBesideGzipBombs(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	h := memoryHandler(b, node.Policy{Name: "p", Limit: fiveAYear})
	url := serveAPI(b, h, h)
	bomb := bytes.Repeat(gzipMembers(1<<20), 3)
	for _, yield := range []bool{true, false} {
		b.Run(map[bool]string{true: "yield=true", false: "yield=false"}[yield], func(b *testing.B) {
			if !yield {
				defer func(every int64) { gzipYieldEvery = every }(gzipYieldEvery)
				gzipYieldEvery = 1 << 62
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var bombs atomic.Int64
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					client := http1Client(b)
					for {
						select {
						case <-stop:
							return
						default:
						}
						req, err := http.NewRequest(http.MethodPost, url+quotadv1connect.QuotaServiceCheckBatchProcedure, bytes.NewReader(bomb))
						if err != nil {
							b.Error(err)
							return
						}
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Content-Encoding", "gzip")
						resp, err := client.Do(req)
						if err != nil {
							b.Error(err)
							return
						}
						resp.Body.Close()
						if resp.StatusCode != http.StatusTooManyRequests {
							b.Errorf("a bomb: %s, want 429", resp.Status)
							return
						}
						bombs.Add(1)
					}
				}()
			}
			c := quotadv1connect.NewQuotaServiceClient(http1Client(b), url)
			req := connect.NewRequest(&quotadv1.CheckRequest{Policy: "p", Key: "k"})
			took := make([]time.Duration, 0, b.N)
			time.Sleep(100 * time.Millisecond) // the bombs under way
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				t0 := time.Now()
				if _, err := c.Check(context.Background(), req); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(t0))
			}
			elapsed := time.Since(start)
			b.StopTimer()
			close(stop)
			wg.Wait()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(bombs.Load())/elapsed.Seconds(), "bombs/s")
		})
	}
}

// BenchmarkGzipBombRefused posts gzip bombs that end in a small member (so
// that their trailer does not refuse them) as CheckBatches, one after
// another, each refused at the 2 MiB bound: B/op is what the process
// (server and client) allocates for one, most of it the server's buffers.
func BenchmarkGzipBombRefused(b *testing.B) {
	h := memoryHandler(b)
	url := serveAPI(b, h, h)
	bomb := gzipMembers(1<<20, 1<<20, 1<<20, 1)
	client := http1Client(b)
	b.ReportAllocs()
	for b.Loop() {
		req, err := http.NewRequest(http.MethodPost, url+quotadv1connect.QuotaServiceCheckBatchProcedure, bytes.NewReader(bomb))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests {
			b.Fatalf("a bomb: %s, want 429", resp.Status)
		}
	}
}
