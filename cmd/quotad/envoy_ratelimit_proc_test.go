package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/quotadtest"
)

// ratelimitProc is a built `quotad envoy-ratelimit` a test started.
type ratelimitProc struct {
	// httpBase is upstream's HTTP port (http://127.0.0.1:PORT); grpcAddr
	// the gRPC port (127.0.0.1:PORT), unless GRPC_UDS moved it.
	httpBase, grpcAddr string
	stdout, stderr     *lockedBuffer
}

// ratelimitRule is a rules file of domain rl: category=account, limit
// per minute.
func ratelimitRule(limit string) string {
	return "domain: rl\ndescriptors:\n  - key: category\n    value: account\n    rate_limit: {unit: minute, requests_per_unit: " + limit + "}\n"
}

// ratelimitEnvFor is upstream's environment for a run on loopback: free
// HTTP, gRPC and debug ports, the rules file text in a RUNTIME_ROOT of its
// own, then env (which wins over any of them).
func ratelimitEnvFor(t *testing.T, rules string, env ...string) (full []string, httpBase, grpcAddr string) {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "config", "config.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	httpPort, grpcPort, debugPort := freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)
	full = append([]string{"RUNTIME_ROOT=" + root, "HOST=127.0.0.1", "PORT=" + httpPort,
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + debugPort}, env...)
	return full, "http://127.0.0.1:" + httpPort, "127.0.0.1:" + grpcPort
}

// startRatelimit runs the built `quotad envoy-ratelimit` with
// ratelimitEnvFor's environment and waits, up to 30s, until /healthcheck
// answers OK. It is killed when the test ends.
func startRatelimit(t *testing.T, rules string, env ...string) *ratelimitProc {
	t.Helper()
	full, httpBase, grpcAddr := ratelimitEnvFor(t, rules, env...)
	p := &ratelimitProc{httpBase: httpBase, grpcAddr: grpcAddr, stdout: &lockedBuffer{}, stderr: &lockedBuffer{}}
	cmd := exec.Command(quotadtest.Binary(t), "envoy-ratelimit")
	cmd.Env = full
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get(httpBase + "/healthcheck"); err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == 200 && string(body) == "OK" {
				return p
			}
		}
		select {
		case <-exited:
			t.Fatalf("quotad envoy-ratelimit exited:\n%s\n%s", p.stdout.tail(), p.stderr.tail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck never answered OK:\n%s\n%s", p.stdout.tail(), p.stderr.tail())
		}
	}
}

// ratelimitFails runs the built `quotad envoy-ratelimit` with
// ratelimitEnvFor's environment, expecting it to stop at start, and
// returns what it said. A start that serves fails the test.
func ratelimitFails(t *testing.T, rules string, env ...string) string {
	t.Helper()
	full, _, _ := ratelimitEnvFor(t, rules, env...)
	cmd := exec.Command(quotadtest.Binary(t), "envoy-ratelimit")
	cmd.Env = full
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("quotad envoy-ratelimit still running after 60s, want it to stop at start:\n%s", out)
	}
	if err == nil {
		t.Fatalf("quotad envoy-ratelimit exited 0, want it to stop at start:\n%s", out)
	}
	return string(out)
}

// askJSON posts the request for category=account of domain rl to /json
// and returns the status.
func (p *ratelimitProc) askJSON(t *testing.T) int {
	t.Helper()
	return p.askJSONFor(t, "account")
}

// askJSONFor is askJSON of the descriptor category=value.
func (p *ratelimitProc) askJSONFor(t *testing.T, value string) int {
	t.Helper()
	res, err := http.Post(p.httpBase+"/json", "application/json",
		strings.NewReader(`{"domain":"rl","descriptors":[{"entries":[{"key":"category","value":"`+value+`"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}
