package algorithms_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
)

// benchKeys is how many keys the script benchmarks spread their checks over.
const benchKeys = 1000

// benchLimit is a realistic limit, 1000 per second. At one check per ms with
// cost benchCost the models spend faster than the limit refills, so after
// the first burst both allowed and denied checks happen.
func benchLimit(a algorithms.Algorithm) algorithms.Limit {
	return algorithms.Limit{Algorithm: a, Limit: 1000, Period: time.Second}
}

const benchCost = 2

// BenchmarkModel measures one Go model check (the embedded store's work per
// request, without its locking) with the clock advancing 1 ms per check. It
// reports the fraction of checks allowed as allowed/op.
func BenchmarkModel(b *testing.B) {
	for _, a := range algorithms.Algorithms() {
		b.Run(a.String(), func(b *testing.B) {
			l := benchLimit(a)
			s := algorithms.NewState(a)
			now := int64(1_700_000_000_000)
			var n, allowed int
			b.ReportAllocs()
			for b.Loop() {
				if s.Check(l, now, benchCost).Allowed {
					allowed++
				}
				now++
				n++
			}
			b.ReportMetric(float64(allowed)/float64(n), "allowed/op")
		})
	}
}

// BenchmarkScript measures checks through each Lua script on a local
// redis-server: EVALSHA from parallel goroutines over a pooled go-redis
// client, spread over benchKeys keys, the time read from Redis TIME as in
// production. It reports throughput as checks/s.
func BenchmarkScript(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	for _, a := range algorithms.Algorithms() {
		b.Run(a.String(), func(b *testing.B) {
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 4 * runtime.GOMAXPROCS(0)})
			defer rdb.Close()
			script := redis.NewScript(algorithms.CheckScript(a))
			if err := script.Load(ctx, rdb).Err(); err != nil {
				b.Fatalf("load %s: %v", a, err)
			}
			l := benchLimit(a)
			keys := make([][]string, benchKeys)
			for i := range keys {
				keys[i] = algorithms.Keys(a, fmt.Sprintf("{bench:%d}", i))
			}
			args := algorithms.CheckArgs(l, benchCost, 0)
			var start, allowed atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine walks the keys from its own offset, so
				// concurrent checks rarely hit the same key.
				i := start.Add(benchKeys / 16)
				for pb.Next() {
					i++
					reply, err := script.EvalSha(ctx, rdb, keys[i%benchKeys], args...).Result()
					if err != nil {
						b.Errorf("%s: %v", a, err)
						return
					}
					d, err := algorithms.DecodeCheckReply(reply)
					if err != nil {
						b.Errorf("%s: %v", a, err)
						return
					}
					if d.Allowed {
						allowed.Add(1)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
			b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
		})
	}
}
