package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/internal/rlqssim"
)

// rlqsQuotadConfig serves Envoy's rate limit quota service: each client's
// bucket shares 20 a second.
const rlqsQuotadConfig = `
policies:
  - {name: per-client, algorithm: token_bucket, limit: 20, period: 1s}
rlqs:
  assignment_interval: 1s
  domains:
    - domain: edge
      buckets:
        - bucket: {name: "*"}
          policy: per-client
`

// dialEnvoy starts a simulated Envoy streaming to the quotad at hostPort,
// offering 40 requests a second of the bucket {name: alice} until the
// test ends.
func dialEnvoy(t *testing.T, hostPort string) (*rlqssim.Envoy, map[string]string) {
	t.Helper()
	conn, err := grpc.NewClient(hostPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e := rlqssim.New(conn, rlqssim.Config{Domain: "edge", ReportingInterval: time.Second})
	id := map[string]string{"name": "alice"}
	ctx, cancel := context.WithCancel(context.Background())
	load := rlqssim.Drive(ctx, e, id, 40)
	t.Cleanup(func() { cancel(); load.Wait(); e.Close(); conn.Close() })
	return e, id
}

// The Live view shows the limits a simulated Envoy's buckets share on
// the node: the policy, the rate assigned here, the Envoy's stream.
func TestConsoleShowsTheRateLimitQuotaLimits(t *testing.T) {
	chromium := lookChromium(t)
	r := redistest.Start(t)
	base := startBinary(t, "--config", writeFile(t, "quotad.yaml", rlqsQuotadConfig), "--redis", r.URL())
	e, id := dialEnvoy(t, strings.TrimPrefix(base, "http://"))
	deadline := time.Now().Add(30 * time.Second)
	for e.Bucket(id).Rate == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Envoy got no token bucket within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	b := newBrowser(t, chromium)
	b.do(t, "open the Live view", chromedp.Navigate(base+"/#live"), chromedp.WaitVisible(chromedp.CSS(`#rlqs-panel`)))
	b.waitJS(t, "the per-client row with a rate assigned in (0, 20]", `(() => {
		const r = document.querySelector('tr[data-rlqs-policy="per-client"]');
		if (!r) return false;
		const v = parseFloat(r.querySelector('.rlqs-assigned').textContent);
		return v > 0 && v <= 20;
	})()`)
	if got := b.text(t, "#rlqs-legend"); !strings.HasPrefix(got, "1 Envoy stream ·") {
		t.Errorf("legend %q, want one Envoy stream", got)
	}
}

// SIGTERM with an Envoy's stream open: the rounds stop, the stream ends,
// and quotad exits 0 without cutting anything at the shutdown deadline.
func TestSIGTERMEndsRateLimitQuotaStreams(t *testing.T) {
	r := redistest.Start(t)
	p := startProcess(t, "--config", writeFile(t, "quotad.yaml", rlqsQuotadConfig), "--redis", r.URL(), "--shutdown-timeout", "60s")
	e, id := dialEnvoy(t, strings.TrimPrefix(p.URL, "http://"))
	deadline := time.Now().Add(30 * time.Second)
	for e.Bucket(id).Rate == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Envoy got no token bucket within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("quotad exited with %v\n%s", err, p.stderr.text())
		}
	case <-time.After(90 * time.Second):
		t.Fatal("quotad did not exit within 90 s of SIGTERM")
	}
	if s := p.stderr.text(); strings.Contains(s, "still running at the deadline") {
		t.Fatalf("the shutdown waited for the stream until its deadline:\n%s", s)
	}
}
