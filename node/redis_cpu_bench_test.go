package node_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	redisstore "github.com/quotad/quotad/node/store/redis"
)

// Redis CPU per check on cold keys, measured in one run
// against one redis-server:
//
//	go test -run '^$' -bench RedisCPU -benchtime 50000x ./node
//
// BenchmarkRedisCPU/<algorithm> makes b.N plain checks (cost 1, no lease)
// through a RedisStore from cpuClients goroutines (c=16),
// each check on a key not checked before (the first of 100,000 distinct
// keys, then the next run's), and reports redis-server's CPU time per check
// (INFO cpu: used_cpu_sys + used_cpu_user, delta) as redis-µs/check, and
// script calls (EVALSHAs), fresh writes (plain SET ... NX, see
// algorithms.Fresh) and round trips per check: the batches the pipeline
// formed.
// BenchmarkRedisCPU/floor-* are the reference: the same number of checks
// as INCRBY + PEXPIRE on distinct keys, pipelined, from the same number of
// goroutines — "perreq" one two-command pipeline per check (as
// envoyproxy/ratelimit sends them), "batched" the checks of cpuBatch
// goroutines' worth in one pipeline (the cheapest Redis can be fed).
// Divide an algorithm's redis-µs/check by a floor's for the ratio.

const (
	cpuClients = 16
	cpuKeys    = 100_000
	cpuBatch   = 64
)

func BenchmarkRedisCPU(b *testing.B) {
	r := redistest.Start(b)
	ctx := context.Background()
	s, err := redisstore.New(ctx, redisstore.Config{URL: r.URL(), Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	raw := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: cpuClients})
	b.Cleanup(func() { _ = raw.Close() })
	var round atomic.Int64
	keyOf := func(prefix string, i int64) string {
		return "{" + prefix + ":" + strconv.FormatInt(round.Load(), 10) + ":" + strconv.FormatInt(i%cpuKeys, 10) + "}"
	}

	for _, a := range algorithms.Algorithms() {
		b.Run(a.String(), func(b *testing.B) {
			round.Add(1)
			l := algorithms.Limit{Algorithm: a, Limit: 1000, Period: time.Minute}
			calls0 := s.ScriptCalls()
			fresh0 := s.PlainCalls()
			trips0 := s.RoundTrips()
			measureRedisCPU(b, r, func(i int64) error {
				_, _, err := s.Acquire(ctx, node.AcquireRequest{Base: keyOf("c", i), Limit: l, Cost: 1, Want: 1})
				return err
			})
			calls1 := s.ScriptCalls()
			fresh1 := s.PlainCalls()
			trips1 := s.RoundTrips()
			b.ReportMetric(float64(calls1-calls0)/float64(b.N), "scriptcalls/check")
			b.ReportMetric(float64(fresh1-fresh0)/float64(b.N), "plaincalls/check")
			b.ReportMetric(float64(trips1-trips0)/float64(b.N), "roundtrips/check")
		})
	}
	b.Run("floor-perreq", func(b *testing.B) {
		round.Add(1)
		measureRedisCPU(b, r, func(i int64) error {
			k := keyOf("f", i)
			_, err := raw.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.IncrBy(ctx, k, 1)
				p.PExpire(ctx, k, time.Minute)
				return nil
			})
			return err
		})
	})
	b.Run("floor-batched", func(b *testing.B) {
		round.Add(1)
		var next atomic.Int64
		n := int64(b.N)
		measureRedisCPUWorkers(b, r, cpuClients/cpuBatch+1, func() error {
			for {
				first := next.Add(cpuBatch) - cpuBatch
				if first >= n {
					return nil
				}
				_, err := raw.Pipelined(ctx, func(p redis.Pipeliner) error {
					for i := first; i < min(first+cpuBatch, n); i++ {
						k := keyOf("f", i)
						p.IncrBy(ctx, k, 1)
						p.PExpire(ctx, k, time.Minute)
					}
					return nil
				})
				if err != nil {
					return err
				}
			}
		})
	})
}

// measureRedisCPU runs check(i) for i in [0, b.N) from cpuClients
// goroutines and reports Redis CPU per check.
func measureRedisCPU(b *testing.B, r *redistest.Server, check func(i int64) error) {
	var next atomic.Int64
	n := int64(b.N)
	measureRedisCPUWorkers(b, r, cpuClients, func() error {
		for {
			i := next.Add(1) - 1
			if i >= n {
				return nil
			}
			if err := check(i); err != nil {
				return err
			}
		}
	})
}

// measureRedisCPUWorkers empties Redis first: keys an earlier run left
// would otherwise expire (and grow and rehash the keyspace) on this run's
// CPU time. Keys this run writes that expire during it (a token bucket's
// after a few ms) are this run's cost; the floors' live a minute and are
// deleted only after their run, so they count against the algorithms.
func measureRedisCPUWorkers(b *testing.B, r *redistest.Server, workers int, work func() error) {
	if _, err := r.Do("FLUSHALL"); err != nil {
		b.Fatal(err)
	}
	cpu0 := redisCPU(b, r)
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := work(); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	cpu1 := redisCPU(b, r)
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "redis-µs/check")
}

// redisCPU is redis-server's CPU time so far: used_cpu_sys + used_cpu_user.
func redisCPU(b *testing.B, r *redistest.Server) time.Duration {
	var total time.Duration
	for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
		v, err := r.Info("INFO cpu", f)
		if err != nil {
			b.Fatal(err)
		}
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil {
			b.Fatal(fmt.Errorf("INFO cpu %s: %q: %w", f, v, err))
		}
		total += time.Duration(sec * float64(time.Second))
	}
	return total
}
