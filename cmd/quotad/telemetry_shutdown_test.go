package main

import (
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// With an OTLP collector that cannot be reached, OpenTelemetry's own
// export errors land in quotad's structured log (component=otel), and
// shutdown does not wait out the exporter's 10 s timeout: the last flush
// gets telemetryFlushTimeout.
func TestUnreachableCollectorIsLoggedAndDoesNotHoldShutdown(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100") // export every 100 ms
	t.Run("errors in the log", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "300") // give up each export after 300 ms
		p := startProcess(t, "--trace-exporter", "otlp-grpc", "--trace-endpoint", "http://"+closedPort(t))
		postCheck(t, p.URL, `{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"3","period":"60s"}}`)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(p.stderr.tail(), "component=otel") {
			if time.Now().After(deadline) {
				t.Fatalf("no component=otel line in the log:\n%s", p.stderr.tail())
			}
			time.Sleep(20 * time.Millisecond)
		}
		for _, line := range strings.Split(p.stderr.tail(), "\n") {
			if strings.Contains(line, "component=otel") && !strings.HasPrefix(line, "time=") {
				t.Errorf("otel line not in quotad's format: %q", line)
			}
		}
	})
	t.Run("shutdown bounded", func(t *testing.T) {
		// The exporter's default timeout (10 s) and a long shutdown
		// timeout: without the bound, shutdown would wait at least 10 s.
		p := startProcess(t, "--trace-exporter", "otlp-grpc", "--trace-endpoint", "http://"+closedPort(t), "--shutdown-timeout", "30s")
		postCheck(t, p.URL, `{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"3","period":"60s"}}`)
		sent := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		// Generous for a loaded machine under -race; the bound is 2 s.
		const within = 8 * time.Second
		select {
		case err := <-p.exited:
			if err != nil {
				t.Fatalf("quotad exited with %v:\n%s", err, p.stderr.tail())
			}
		case <-time.After(within):
			t.Fatalf("quotad still running %s after SIGTERM:\n%s", within, p.stderr.tail())
		}
		t.Logf("exited %s after SIGTERM (flush bound %s)", time.Since(sent).Round(time.Millisecond), telemetryFlushTimeout)
	})
}
