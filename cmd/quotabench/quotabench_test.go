package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
)

// startQuotad serves a real node on store behind rpc's handler on a fresh
// loopback port, over HTTP/1.1 and h2c as cmd/quotad does, until the test
// ends. It returns the base URL.
func startQuotad(t *testing.T, store node.Store) string {
	t.Helper()
	n, err := node.New(node.Config{}, store, nil)
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	// The tests' inline limits span a year, past the 24h default cap.
	h, err := rpc.NewHandler(n, rpc.Config{MaxInlinePeriod: algorithms.MaxPeriod}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln) // http.ErrServerClosed after Close
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// bench runs quotabench with args plus -json and returns the decoded
// report and run's error.
func bench(t *testing.T, args ...string) (report, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), append(args, "-json"), &stdout, &stderr)
	var rep report
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("run(%q): report is not JSON (%v); err %v\nstdout: %s\nstderr: %s", args, jerr, err, stdout.String(), stderr.String())
	}
	return rep, err
}

// One key, a fixed window far longer than the run: exactly limit checks are
// admitted and the rest denied, all by the store, over both protocols.
func TestSingleKeyFixedWindowIsExact(t *testing.T) {
	const n, limit = 300, 37
	url := startQuotad(t, memory.New(nil, 0))
	for _, protocol := range []string{protocolConnect, protocolGRPC} {
		t.Run(protocol, func(t *testing.T) {
			rep, err := bench(t, "-addr", url, "-protocol", protocol, "-clients", "8",
				"-requests", strconv.Itoa(n), "-duration", "1m",
				// A 365-day window (aligned to the epoch) cannot end mid-run
				// except once a year.
				"-algorithm", "fixed_window", "-limit", strconv.Itoa(limit), "-period", "8760h",
				"-policy", "bench-"+protocol, "-keys", "single", "-key-prefix", "exact-"+protocol+"-")
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if rep.Checks != n || rep.Allowed != limit || rep.Denied != n-limit || rep.Errors != 0 {
				t.Fatalf("checks %d allowed %d denied %d errors %d (%v), want %d, %d, %d, 0",
					rep.Checks, rep.Allowed, rep.Denied, rep.Errors, rep.ErrorsByCode, n, limit, n-limit)
			}
			want := map[string]sourceCount{"STORE": {Allowed: limit, Denied: n - limit}}
			if len(rep.Sources) != 1 || rep.Sources["STORE"] != want["STORE"] {
				t.Fatalf("sources %v, want %v", rep.Sources, want)
			}
			if rep.Config.Protocol != protocol || rep.Config.NKeys != 1 {
				t.Fatalf("config echoed %+v", rep.Config)
			}
			if rep.Latency.P50 <= 0 || rep.Latency.P50 > rep.Latency.P99 || rep.Latency.P99 > rep.Latency.Max {
				t.Fatalf("latency %+v: want 0 < p50 <= p99 <= max", rep.Latency)
			}
			if rep.ChecksPerSecond <= 0 || rep.ElapsedSeconds <= 0 {
				t.Fatalf("rate %v over %vs", rep.ChecksPerSecond, rep.ElapsedSeconds)
			}
		})
	}
}

// On Redis, with cold keys (no leases) and nothing denied (no denied
// cache), every fixed-window check far from its window's edge is plain
// commands, no script: an INCRBY and a PEXPIREAT ... NX
// (algorithms.WindowIncrement; the INCRBY alone for a key the node saw
// counting in this window), which the report counts by command, as Redis
// does.
func TestRedisCallsPerCheck(t *testing.T) {
	r := redistest.Start(t)
	store, err := redis.New(context.Background(), redis.Config{URL: r.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	url := startQuotad(t, store)
	const n = 400
	start := time.Now()
	rep, err := bench(t, "-addr", url, "-protocol", "grpc", "-clients", "4", "-requests", strconv.Itoa(n),
		"-algorithm", "fixed_window", "-limit", "1000000", "-period", "1h",
		"-keys", "uniform", "-nkeys", "1000000", "-key-prefix", "redis-calls-", "-redis", r.Addr())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if rep.Checks != n || rep.Allowed != n {
		t.Fatalf("checks %d allowed %d errors %v, want %d all allowed", rep.Checks, rep.Allowed, rep.ErrorsByCode, n)
	}
	if len(rep.Sources) != 1 || rep.Sources["STORE"].Allowed != n {
		t.Fatalf("sources %v, want every check decided by the store (no leases)", rep.Sources)
	}
	rr := rep.Redis
	if rr == nil {
		t.Fatal("no redis figures in the report")
	}
	// A key drawn twice (about one run in twelve) is known to have its
	// TTL the second time: its INCRBY goes alone.
	if rr.ByCommand["incrby"] != n || rr.ByCommand["pexpireat"] > n || rr.ByCommand["pexpireat"] < n-10 || rr.Scripts != 0 || rr.ScriptsPerCheck != 0 {
		t.Fatalf("by command %v, %d scripts (%.3f per check); want an INCRBY and a PEXPIREAT per check and no script", rr.ByCommand, rr.Scripts, rr.ScriptsPerCheck)
	}
	if rr.CommandsPerCheck < 1.97 || rr.CommandsPerCheck > 2.05 {
		t.Fatalf("%.3f commands per check, want 2", rr.CommandsPerCheck)
	}
	// quotabench subtracts its own INFO calls; what remains is quotad's
	// store state check (INFO server, once a second and at start).
	if rr.OwnInfoCalls == 0 || rr.ByCommand["info"] > int64(time.Since(start)/time.Second)+2 {
		t.Fatalf("%d INFO calls of quotabench's own subtracted, %d left: quotad makes at most one a second; by command %v", rr.OwnInfoCalls, rr.ByCommand["info"], rr.ByCommand)
	}
}

// A run where every check fails prints the report and returns an error.
func TestEveryCheckFailedIsAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	rep, err := bench(t, "-addr", "http://"+addr, "-protocol", "connect", "-clients", "2", "-requests", "6", "-policy", "p")
	if err == nil || !strings.Contains(err.Error(), "all 6 checks failed") {
		t.Fatalf("err %v, want all 6 checks failed", err)
	}
	if rep.Checks != 6 || rep.Errors != 6 || rep.ErrorsByCode["unavailable"] != 6 {
		t.Fatalf("checks %d errors %d by code %v, want 6 unavailable", rep.Checks, rep.Errors, rep.ErrorsByCode)
	}
}

// Denials by a configured policy that does not exist are errors by code,
// and the text report names them.
func TestErrorsByCodeInText(t *testing.T) {
	url := startQuotad(t, memory.New(nil, 0))
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-addr", url, "-policy", "nope", "-requests", "5", "-clients", "1"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "not_found: 5") {
		t.Fatalf("err %v, want all 5 failing with not_found", err)
	}
	out := stdout.String()
	for _, want := range []string{"checks     5", "errors     5 (100.0%)", "not_found", "by source", "latency"} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"-help"}, &stdout, &stderr)
	if !errors.Is(err, errHelp) {
		t.Fatalf("err %v, want errHelp", err)
	}
	for _, flag := range []string{"-addr", "-protocol", "-clients", "-duration", "-requests", "-timeout", "-policy",
		"-algorithm", "-limit", "-period", "-burst", "-cost", "-keys", "-nkeys", "-zipf-s", "-seed", "-key-prefix", "-redis", "-json"} {
		if !strings.Contains(stdout.String(), flag+" ") && !strings.Contains(stdout.String(), flag+"\n") {
			t.Errorf("usage lacks %s", flag)
		}
	}
}

// Every bad flag gives one error naming the flag, before any check is sent.
func TestFlagErrors(t *testing.T) {
	inline := []string{"-algorithm", "fixed_window", "-limit", "10", "-period", "1s"}
	cases := []struct {
		name string
		args []string
		flag string
	}{
		{"bad protocol", []string{"-protocol", "http3", "-policy", "p"}, "-protocol"},
		{"negative clients", []string{"-clients", "-1", "-policy", "p"}, "-clients"},
		{"zero clients", []string{"-clients", "0", "-policy", "p"}, "-clients"},
		{"duration over 10m", []string{"-duration", "11m", "-policy", "p"}, "-duration"},
		{"zero duration", []string{"-duration", "0s", "-policy", "p"}, "-duration"},
		{"negative requests", []string{"-requests", "-5", "-policy", "p"}, "-requests"},
		{"zero timeout", []string{"-timeout", "0s", "-policy", "p"}, "-timeout"},
		{"zipf-s 1", append([]string{"-keys", "zipf", "-zipf-s", "1"}, inline...), "-zipf-s"},
		{"zipf-s below 1", append([]string{"-keys", "zipf", "-zipf-s", "0.5"}, inline...), "-zipf-s"},
		{"zipf-s NaN", append([]string{"-keys", "zipf", "-zipf-s", "NaN"}, inline...), "-zipf-s"},
		{"unknown algorithm", []string{"-algorithm", "leaky", "-limit", "1", "-period", "1s"}, "-algorithm"},
		{"limit 0", []string{"-algorithm", "fixed_window", "-limit", "0", "-period", "1s"}, "-limit"},
		{"limit missing", []string{"-algorithm", "fixed_window", "-period", "1s"}, "-limit"},
		{"period missing", []string{"-algorithm", "fixed_window", "-limit", "1"}, "-period"},
		{"period not whole ms", []string{"-algorithm", "fixed_window", "-limit", "1", "-period", "1500us"}, "-period"},
		{"burst on a window", append([]string{"-burst", "5"}, inline...), "-burst"},
		{"limit without algorithm", []string{"-policy", "p", "-limit", "5"}, "-limit"},
		{"neither policy nor inline", []string{}, "-policy"},
		{"bad policy name", []string{"-policy", "a:b"}, "-policy"},
		{"negative cost", append([]string{"-cost", "-1"}, inline...), "-cost"},
		{"cost over capacity", append([]string{"-cost", "11"}, inline...), "-cost"},
		{"bad keys", append([]string{"-keys", "pareto"}, inline...), "-keys"},
		{"nkeys 0", append([]string{"-nkeys", "0"}, inline...), "-nkeys"},
		{"nkeys with single", append([]string{"-keys", "single", "-nkeys", "5"}, inline...), "-nkeys"},
		{"key prefix too long", append([]string{"-key-prefix", strings.Repeat("x", 1024)}, inline...), "-key-prefix"},
		{"https addr", append([]string{"-addr", "https://example.com"}, inline...), "-addr"},
		{"addr without host", append([]string{"-addr", "http://"}, inline...), "-addr"},
		{"bad redis", append([]string{"-redis", "localhost"}, inline...), "-redis"},
		{"bad fail mode", append([]string{"-fail", "maybe"}, inline...), "-fail"},
		{"not a number", []string{"-clients", "many", "-policy", "p"}, "-clients"},
		{"unknown flag", []string{"-colour", "red"}, "-colour"},
		{"stray argument", append(inline, "extra"), "extra"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// No quotad listens at this address: a bad flag must stop the
			// run before any check, and a good one would fail with
			// "all checks failed" instead.
			args := append([]string{"-addr", "http://127.0.0.1:1"}, c.args...)
			if c.flag == "-addr" {
				args = c.args
			}
			err := run(context.Background(), args, &stdout, &stderr)
			if err == nil {
				t.Fatalf("run(%q) succeeded", c.args)
			}
			if !strings.Contains(err.Error(), c.flag) {
				t.Fatalf("run(%q): %v; want it to name %s", c.args, err, c.flag)
			}
			if strings.Contains(err.Error(), "checks failed") || stdout.Len() > 0 {
				t.Fatalf("run(%q) sent checks: %v\n%s", c.args, err, stdout.String())
			}
		})
	}
}
