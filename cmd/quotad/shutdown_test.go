package main

import (
	"bufio"
	"context"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// quotadProcess is quotad running as its own process.
type quotadProcess struct {
	cmd    *exec.Cmd
	URL    string
	stderr *lockedBuffer
	exited chan error
}

// startProcess starts the quotad binary with args on a free loopback port
// and waits until it says where it listens. It is killed when the test
// ends if it is still running.
func startProcess(t *testing.T, args ...string) *quotadProcess {
	t.Helper()
	cmd := exec.Command(quotadtest.Binary(t), append([]string{"--listen", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &quotadProcess{cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		_ = cmd.Process.Kill()
		t.Fatalf("quotad printed nothing: %v", cmd.Wait())
	}
	first := lines.Text()
	go func() {
		for lines.Scan() {
		}
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	const marker = "quotad listening on "
	if !strings.HasPrefix(first, marker) {
		t.Fatalf("first line %q does not say where quotad listens", first)
	}
	p.URL = strings.Fields(strings.TrimPrefix(first, marker))[0]
	return p
}

// SIGTERM under load: every check the server admitted is answered, the
// units its leases held go back to Redis (the authority ends up counting
// exactly the allowed checks clients saw), and the process exits 0 within
// the shutdown timeout.
//
// Over Connect (HTTP/1.1, net/http) and over gRPC (grpc-go's transport):
// both front ends drain.
func TestSIGTERMUnderLoadReturnsLeasesAndExitsZero(t *testing.T) {
	for _, protocol := range []string{"connect", "grpc"} {
		t.Run(protocol, func(t *testing.T) { sigtermUnderLoad(t, protocol) })
	}
}

func sigtermUnderLoad(t *testing.T, protocol string) {
	r := redistest.Start(t)
	// A one-year fixed window: no window turns during the test, so every
	// returned unit counts.
	lim := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10_000_000, Period: algorithms.MaxPeriod}
	cfg := writeFile(t, "q.yaml", "policies:\n  - name: leased\n    algorithm: fixed_window\n    limit: 10000000\n    period: 8760h\n")
	const shutdownTimeout = 10 * time.Second
	p := startProcess(t, "--config", cfg, "--redis", r.URL(), "--redis-timeout", "1s", "--shutdown-timeout", shutdownTimeout.String())

	store, err := redis.New(context.Background(), redis.Config{URL: r.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	used := func() int64 {
		d, _, err := store.Acquire(context.Background(), node.AcquireRequest{Base: "{quotad:leased:k}", Limit: lim})
		if err != nil {
			t.Fatal(err)
		}
		return lim.Limit - d.Remaining
	}

	check := checker(t, protocol, p.URL)
	var allowed, answered, failedAfterTerm, failedBeforeTerm atomic.Int64
	var termed atomic.Bool
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ok, err := check(&quotadv1.CheckRequest{Policy: "leased", Key: "k"})
				if err != nil {
					// Once the listener closes, new requests are refused:
					// that ends this client's load.
					if termed.Load() {
						failedAfterTerm.Add(1)
						return
					}
					failedBeforeTerm.Add(1)
					return
				}
				answered.Add(1)
				if ok {
					allowed.Add(1)
				}
			}
		}()
	}

	// Wait until the load is well under way and the node holds leased
	// units: the authority counts more than the clients have been allowed.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if u, a := used(), allowed.Load(); u > a && answered.Load() > 2000 {
			t.Logf("under load: authority counts %d used, clients were allowed %d", u, a)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node never held leased units")
		}
		time.Sleep(10 * time.Millisecond)
	}

	termed.Store(true)
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("quotad exited with %v; stderr:\n%s", err, p.stderr.tail())
		}
	case <-time.After(shutdownTimeout + 5*time.Second):
		t.Fatalf("quotad still running %s after SIGTERM", shutdownTimeout+5*time.Second)
	}
	took := time.Since(sent)
	wg.Wait()

	if n := failedBeforeTerm.Load(); n > 0 {
		t.Fatalf("%d checks failed before SIGTERM", n)
	}
	if u, a := used(), allowed.Load(); u != a {
		t.Fatalf("after shutdown the authority counts %d used for %d allowed checks: leased units were not returned, or an admitted check went unanswered", u, a)
	}
	if !strings.Contains(p.stderr.tail(), "shut down") {
		t.Errorf("no shutdown log line in:\n%s", p.stderr.tail())
	}
	t.Logf("exit 0 %s after SIGTERM; %d checks answered, %d allowed; authority agrees", took.Round(time.Millisecond), answered.Load(), allowed.Load())
}

// checker returns a function that sends one check to the quotad at url
// over protocol, connect (HTTP/1.1) or grpc (grpc-go's client), and says
// whether it was allowed.
func checker(t *testing.T, protocol, url string) func(*quotadv1.CheckRequest) (bool, error) {
	t.Helper()
	if protocol == "grpc" {
		conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return func(req *quotadv1.CheckRequest) (bool, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res := &quotadv1.CheckResponse{}
			err := conn.Invoke(ctx, quotadv1connect.QuotaServiceCheckProcedure, req, res)
			return res.GetAllowed(), err
		}
	}
	client := quotadv1connect.NewQuotaServiceClient(&http.Client{Timeout: 5 * time.Second}, url)
	return func(req *quotadv1.CheckRequest) (bool, error) {
		res, err := client.Check(context.Background(), connect.NewRequest(req))
		if err != nil {
			return false, err
		}
		return res.Msg.GetAllowed(), nil
	}
}
