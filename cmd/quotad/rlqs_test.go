package main

import (
	"context"
	"io"
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

// TestRLQSConfigErrorsSayWhatToWrite requires that an rlqs section quotad
// cannot serve stops it at start with the file, the line and the name of
// the field at fault, and what to write instead (docs/errors.md).
func TestRLQSConfigErrorsSayWhatToWrite(t *testing.T) {
	const policies = `policies:
  - {name: tb, algorithm: token_bucket, limit: 100, period: 1s}
  - {name: fw, algorithm: fixed_window, limit: 100, period: 1s}
`
	for _, c := range []struct {
		name, rlqs string
		args       []string
		want       string
	}{
		{"a window policy", "rlqs:\n  domains:\n    - domain: edge\n      buckets:\n        - bucket: {name: \"*\"}\n          policy: fw\n", nil,
			`line 9: rlqs.domains[0].buckets[0].policy: invalid rlqs config: "fw" uses fixed_window, but Envoy enforces an assignment as a token bucket refilled at a steady rate, which only token_bucket, leaky_bucket and gcra limit; give the policy one of those algorithms`},
		{"an unknown policy", "rlqs:\n  domains:\n    - domain: edge\n      default: {policy: nope}\n", nil,
			`line 7: rlqs.domains[0].default.policy: invalid rlqs config: "nope" is not a configured policy; add it to policies or name another`},
		{"a policy and an action", "rlqs:\n  domains:\n    - domain: edge\n      buckets:\n        - {bucket: {}, policy: tb, action: deny_all}\n", nil,
			`line 8: rlqs.domains[0].buckets[0]: invalid rlqs config: both policy "tb" and action "deny_all"; write one of them`},
		{"a part of a second", "rlqs:\n  assignment_interval: 1500ms\n  domains:\n    - domain: edge\n      default: {policy: tb}\n", nil,
			`line 5: rlqs.assignment_interval: invalid rlqs config: 1.5s: Envoy counts assignments' lives in whole seconds; write a whole number of seconds from 1s to 1h0m0s`},
		{"without the gRPC front end", "rlqs:\n  domains:\n    - domain: edge\n      default: {policy: tb}\n", []string{"--grpc-transport=connect"},
			`config: rlqs: Envoy's rate limit quota service streams over the gRPC front end, which --grpc-transport=connect turns off; remove --grpc-transport=connect or the rlqs section's domains`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := writeFile(t, "q.yaml", policies+c.rlqs)
			args := append([]string{"--listen", "127.0.0.1:0", "--config", cfg}, c.args...)
			err := run(t.Context(), args, func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v\nwant %q", err, c.want)
			}
		})
	}
}
