package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	redisstore "github.com/quotad/quotad/node/store/redis"
)

// What a quotad deployment costs Redis Cluster, measured in one run
// against a one-master and a three-master Redis Cluster on loopback:
//
//	go test -run '^$' -bench RedisClusterCapacity -benchtime 3s ./node
//
// BenchmarkRedisClusterCapacity/<masters>m/<workload>/<algorithm> runs
// node.Check from capacityClients goroutines through one node (leases and
// the denied cache on, as a quotad node runs) on the Redis Cluster store,
// and reports:
//
//   - checks/s, what the run's node achieved on this machine (the load
//     generator, the node and every redis-server share its cores, so this
//     is not a capacity figure);
//   - redis-µs/check, the CPU all masters spent per check (INFO cpu), and
//     busiest-shard-µs/check, the most one master spent per check: a
//     master is one thread, so 1e6 / busiest-shard-µs/check is the checks
//     per second at which that master's core is full
//     (shard-capacity-checks/s);
//   - shard-skew, the busiest master's CPU over the masters' mean (1 is an
//     even spread).
//
// Workloads: hot (one key under a limit it never reaches: a lease answers
// nearly every check), denied (one key over its limit: the denied cache
// answers), cold (a key never checked before on every check, 100,000 a
// round) and zipf (keys drawn from Zipf(s=1.1) over 1,000,000, the usual
// skew of API keys and client addresses). docs/scaling.md turns the
// figures into a sizing rule.

const (
	capacityClients = 16
	capacityZipfN   = 1_000_000
)

func BenchmarkRedisClusterCapacity(b *testing.B) {
	for _, masters := range []int{1, 3} {
		b.Run(strconv.Itoa(masters)+"m", func(b *testing.B) {
			c := redistest.StartCluster(b, masters)
			var round atomic.Int64
			for _, w := range capacityWorkloads {
				b.Run(w.name, func(b *testing.B) {
					for _, a := range algorithms.Algorithms() {
						b.Run(a.String(), func(b *testing.B) {
							round.Add(1)
							measureClusterCapacity(b, c, a, w, round.Load())
						})
					}
				})
			}
		})
	}
}

// capacityWorkload is one key distribution and the limit its keys have.
type capacityWorkload struct {
	name string
	// limit is the checks a key may make per minute.
	limit int64
	// key is the key of check i of worker w (whose rng it may use).
	key func(round, i int64, rng *rand.Rand, zipf *rand.Zipf) string
}

var capacityWorkloads = []capacityWorkload{
	{"hot", algorithms.MaxSlidingLogLimit, func(round, _ int64, _ *rand.Rand, _ *rand.Zipf) string {
		return "hot-" + strconv.FormatInt(round, 10)
	}},
	{"denied", 1, func(round, _ int64, _ *rand.Rand, _ *rand.Zipf) string {
		return "denied-" + strconv.FormatInt(round, 10)
	}},
	{"cold", 1000, func(round, i int64, _ *rand.Rand, _ *rand.Zipf) string {
		return "cold-" + strconv.FormatInt(round, 10) + "-" + strconv.FormatInt(i, 10)
	}},
	{"zipf", 1000, func(round, _ int64, _ *rand.Rand, z *rand.Zipf) string {
		return "zipf-" + strconv.FormatInt(round, 10) + "-" + strconv.FormatUint(z.Uint64(), 10)
	}},
}

// measureClusterCapacity runs b.N checks of workload w under algorithm a
// and reports the figures BenchmarkRedisClusterCapacity describes.
func measureClusterCapacity(b *testing.B, c *redistest.Cluster, a algorithms.Algorithm, w capacityWorkload, round int64) {
	p := node.Policy{Name: "capacity", Limit: algorithms.Limit{Algorithm: a, Limit: w.limit, Period: time.Minute}}
	// Keys an earlier run left would otherwise expire, and grow and
	// rehash the keyspace, on this run's CPU time.
	for i := range c.Len() {
		if _, err := c.Master(i).Do("FLUSHALL"); err != nil {
			b.Fatal(err)
		}
	}
	// A store of its own: the node closes it.
	s, err := redisstore.New(context.Background(), redisstore.Config{ClusterAddrs: c.Addrs(), Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	n, err := node.New(node.Config{Policies: []node.Policy{p}}, s, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	cpu0 := clusterCPU(b, c)
	var next atomic.Int64
	total := int64(b.N)
	var failed atomic.Pointer[string]
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for worker := range capacityClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(round), uint64(worker)))
			zipf := rand.NewZipf(rng, 1.1, 1, capacityZipfN-1)
			ctx := context.Background()
			for i := next.Add(1) - 1; i < total; i = next.Add(1) - 1 {
				res, err := n.Check(ctx, p, w.key(round, i, rng, zipf), 1)
				if err != nil || res.Source == node.SourceFailOpen || res.Source == node.SourceFailClosed {
					why := fmt.Sprintf("%+v, %v", res, err)
					failed.Store(&why)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if why := failed.Load(); why != nil {
		b.Fatalf("a check failed or took the failure mode: %s", *why)
	}
	cpu1 := clusterCPU(b, c)
	var sum, busiest time.Duration
	for i := range cpu1 {
		d := cpu1[i] - cpu0[i]
		sum += d
		busiest = max(busiest, d)
	}
	perCheck := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
	b.ReportMetric(perCheck(sum), "redis-µs/check")
	b.ReportMetric(perCheck(busiest), "busiest-shard-µs/check")
	if perCheck(busiest) > 0 {
		b.ReportMetric(1e6/perCheck(busiest), "shard-capacity-checks/s")
	}
	if sum > 0 {
		b.ReportMetric(float64(busiest)*float64(len(cpu1))/float64(sum), "shard-skew")
	}
}

// clusterCPU is each master's CPU time so far.
func clusterCPU(b *testing.B, c *redistest.Cluster) []time.Duration {
	out := make([]time.Duration, c.Len())
	for i := range out {
		var total time.Duration
		for _, f := range []string{"used_cpu_sys", "used_cpu_user"} {
			v, err := c.Master(i).Info("INFO cpu", f)
			if err != nil {
				b.Fatal(err)
			}
			sec, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += time.Duration(sec * float64(time.Second))
		}
		out[i] = total
	}
	return out
}
