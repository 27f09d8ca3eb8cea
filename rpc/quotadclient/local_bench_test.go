package quotadclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// A Go HTTP service behind the middleware, every
// request on one hot key, three ways at once: with no limiter (none), with
// the middleware checking every request at quotad (remote), and with it in
// local mode (local). Each iteration sends one request to each of the three
// servers, in turn, so that all three see the same moments of a machine
// shared with other work. It reports the p50 and p99 of each one's request
// latency (none-p50-µs …), what the middleware adds at the p99
// (local-added-p99-µs, remote-added-p99-µs: the difference from none's),
// and how many calls reached quotad per 1,000 requests
// (local-calls/1000req, remote-calls/1000req: Check, CheckBatch,
// AcquireLease and ReturnLease, counted by each one's quotad node).
//
//	go test -run '^$' -bench BenchmarkMiddlewareHotKey -benchtime 20000x ./rpc/quotadclient
func BenchmarkMiddlewareHotKey(b *testing.B) {
	r := redistest.Start(b)
	p := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100_000_000, Period: time.Minute}}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	modes := []string{"none", "remote", "local"}
	urls := make([]string, len(modes))
	nodes := make([]*leaseNode, len(modes))
	for i, mode := range modes {
		var h http.Handler = ok
		if mode != "none" {
			nodes[i] = &startLeaseNodes(b, r, 1, p)[0]
			opts := quotadclient.Options{Protocol: quotadclient.ProtocolGRPC}
			if mode == "local" {
				opts.Local = &quotadclient.LocalOptions{}
			}
			c, err := quotadclient.New(nodes[i].url, opts)
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
		urls[i] = srv.URL
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	hc := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	calls := func(n *leaseNode) int64 {
		return n.calls.get("Check") + n.calls.get("CheckBatch") + n.calls.get("AcquireLease") + n.calls.get("ReturnLease")
	}
	before := make([]int64, len(modes))
	for i, n := range nodes {
		if n != nil {
			before[i] = calls(n)
		}
	}
	var (
		mu  sync.Mutex
		all = make([][]time.Duration, len(modes))
	)
	var turn atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		mine := make([][]time.Duration, len(modes))
		for pb.Next() {
			first := int(turn.Add(1))
			for j := range modes {
				i := (first + j) % len(modes)
				req, _ := http.NewRequest("GET", urls[i], nil)
				req.Header.Set("X-Key", "hot")
				start := time.Now()
				res, err := hc.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				mine[i] = append(mine[i], time.Since(start))
				if res.StatusCode != http.StatusOK {
					b.Errorf("%s: status %d", modes[i], res.StatusCode)
					return
				}
			}
		}
		mu.Lock()
		for i := range modes {
			all[i] = append(all[i], mine[i]...)
		}
		mu.Unlock()
	})
	b.StopTimer()
	p99 := make([]time.Duration, len(modes))
	for i, mode := range modes {
		d := all[i]
		if len(d) == 0 {
			return
		}
		slices.Sort(d)
		p99[i] = d[len(d)*99/100]
		b.ReportMetric(float64(d[len(d)/2].Microseconds()), mode+"-p50-µs")
		b.ReportMetric(float64(p99[i].Microseconds()), mode+"-p99-µs")
		if nodes[i] != nil {
			b.ReportMetric(float64((p99[i] - p99[0]).Microseconds()), mode+"-added-p99-µs")
			b.ReportMetric(float64(calls(nodes[i])-before[i])*1000/float64(len(d)), mode+"-calls/1000req")
		}
	}
}
