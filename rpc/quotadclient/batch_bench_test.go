package quotadclient_test

import (
	"bufio"
	"context"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// 64 goroutines check distinct cold keys through
// one client in local mode against a quotad process on a real
// redis-server, with the client's batching off (BatchWindow < 0: one Check
// per check) and on (the default). Each reports checks/s, the quotad
// process's CPU per check (server-µs/check, from /proc, 10 ms resolution)
// and the checks per call that reached it (checks/RPC). Compare the two in
// one run: on a machine shared with other work only the ratios mean much.
//
//	go test -run '^$' -bench BenchmarkColdKeysBatching -benchtime 20000x ./rpc/quotadclient
func BenchmarkColdKeysBatching(b *testing.B) {
	r := redistest.Start(b)
	url, pid := startQuotadProcess(b, "--redis", r.URL())
	limit := algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100, Period: time.Minute}
	for _, mode := range []string{"batch-off", "batch-on"} {
		b.Run(mode, func(b *testing.B) {
			opts := quotadclient.LocalOptions{}
			if mode == "batch-off" {
				opts.BatchWindow = -1
			}
			calls := &countingTransport{next: &http.Transport{MaxIdleConnsPerHost: 64}}
			c, err := quotadclient.New(url, quotadclient.Options{Local: &opts, HTTPClient: &http.Client{Transport: calls}})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			const goroutines = 64
			var next atomic.Int64
			cpu0, _, err := quotadtest.ProcStat(pid)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			b.ResetTimer()
			var wg sync.WaitGroup
			for range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						d, err := c.CheckLimit(context.Background(), "cold", limit, mode+"-"+strconv.FormatInt(i, 10), 1)
						if err != nil {
							b.Error(err)
							return
						}
						if !d.Allowed {
							b.Errorf("a cold key's first check: %+v", d)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			took := time.Since(start)
			cpu1, _, err := quotadtest.ProcStat(pid)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/took.Seconds(), "checks/s")
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "server-µs/check")
			b.ReportMetric(float64(b.N)/float64(calls.n.Load()), "checks/RPC")
		})
	}
}

// countingTransport counts the HTTP requests it carries.
type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.n.Add(1)
	return t.next.RoundTrip(req)
}

// startQuotadProcess starts the quotad binary with args on a free loopback
// port and returns its URL and process id; it is killed when the test
// ends.
func startQuotadProcess(t testing.TB, args ...string) (url string, pid int) {
	t.Helper()
	cmd := exec.Command(quotadtest.Binary(t), append([]string{"--listen", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatal("quotad printed nothing")
	}
	const marker = "quotad listening on "
	first := lines.Text()
	if !strings.HasPrefix(first, marker) {
		t.Fatalf("first line %q does not say where quotad listens", first)
	}
	go func() {
		for lines.Scan() {
		}
	}()
	return strings.Fields(strings.TrimPrefix(first, marker))[0], cmd.Process.Pid
}
