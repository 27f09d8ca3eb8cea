package node_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

// BenchmarkLeaseOffHotKey is one hot key whose policy has leases off,
// checked by 16 goroutines through node.Check on a
// real redis-server with the default --redis-timeout, the RPC layer left
// out:
//
//	go test -run '^$' -bench LeaseOffHotKey -benchtime 20000x ./node
//
// It reports checks/s, the 99th percentile latency of a check in ms,
// EVALSHAs per check, and the share of checks answered by the failure mode
// (a call that missed the timeout, on a loaded machine).
func BenchmarkLeaseOffHotKey(b *testing.B) {
	r := redistest.Start(b)
	store, err := redis.New(context.Background(), redis.Config{URL: r.URL()})
	if err != nil {
		b.Fatal(err)
	}
	n, err := node.New(node.Config{}, store, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	p := node.Policy{Name: "direct", Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1_000_000_000, Period: time.Minute}, Lease: node.LeaseOff}
	const clients = 16
	var next, failed atomic.Int64
	lat := make([][]time.Duration, clients)
	evals0, _ := r.Info("INFO commandstats", "cmdstat_evalsha")
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				res, err := n.Check(context.Background(), p, "hot", 1)
				lat[c] = append(lat[c], time.Since(t0))
				if err != nil {
					b.Error(err)
					return
				}
				if res.Source != node.SourceStore {
					failed.Add(1) // a call that missed --redis-timeout on a loaded machine
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	evals1, _ := r.Info("INFO commandstats", "cmdstat_evalsha")
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(evalshaCalls(evals1)-evalshaCalls(evals0))/float64(b.N), "evalsha/check")
	b.ReportMetric(float64(failed.Load())/float64(b.N), "failmode/check")
}

// evalshaCalls reads calls=N from an INFO commandstats value.
func evalshaCalls(v string) int64 {
	var n int64
	for i := len("calls="); i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
		n = n*10 + int64(v[i]-'0')
	}
	return n
}
