package quotadclient_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// Issue 17, "Must show" 2: a Go HTTP service behind the middleware, every
// request on one hot key, with no limiter, with the middleware checking
// every request at quotad, and with it in local mode. Each reports the p99
// of its requests' latency (p99-µs) and how many calls reached quotad per
// 1,000 requests (quotad-calls/1000req: Check, CheckBatch, AcquireLease and
// ReturnLease, counted by the node's server).
//
//	go test -run '^$' -bench BenchmarkMiddlewareHotKey -benchtime 20000x ./rpc/quotadclient
func BenchmarkMiddlewareHotKey(b *testing.B) {
	r := redistest.Start(b)
	p := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100_000_000, Period: time.Minute}}
	nodes := startLeaseNodes(b, r, 1, p)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	for _, mode := range []string{"none", "remote", "local"} {
		b.Run(mode, func(b *testing.B) {
			var h http.Handler = ok
			if mode != "none" {
				opts := quotadclient.Options{Protocol: quotadclient.ProtocolGRPC}
				if mode == "local" {
					opts.Local = &quotadclient.LocalOptions{}
				}
				c, err := quotadclient.New(nodes[0].url, opts)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				mw, err := quotadclient.Middleware(c, quotadclient.MiddlewareConfig{Policy: p.Name, Key: quotadclient.KeyByHeader("X-Key"), Window: time.Minute})
				if err != nil {
					b.Fatal(err)
				}
				h = mw(ok)
			}
			srv := httptest.NewServer(h)
			defer srv.Close()
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.MaxIdleConnsPerHost = 64
			hc := &http.Client{Transport: tr}
			defer tr.CloseIdleConnections()
			calls := func() int64 {
				return nodes[0].calls.get("Check") + nodes[0].calls.get("CheckBatch") + nodes[0].calls.get("AcquireLease") + nodes[0].calls.get("ReturnLease")
			}
			var (
				mu  sync.Mutex
				all []time.Duration
			)
			before := calls()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				for pb.Next() {
					req, _ := http.NewRequest("GET", srv.URL, nil)
					req.Header.Set("X-Key", "hot")
					start := time.Now()
					res, err := hc.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					res.Body.Close()
					mine = append(mine, time.Since(start))
					if res.StatusCode != http.StatusOK {
						b.Errorf("status %d", res.StatusCode)
						return
					}
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			slices.Sort(all)
			if len(all) > 0 {
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
				b.ReportMetric(float64(calls()-before)*1000/float64(len(all)), "quotad-calls/1000req")
			}
		})
	}
}
