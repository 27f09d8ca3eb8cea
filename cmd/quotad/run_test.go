package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

// startQuotad runs quotad in-process on a free loopback port and returns its
// base URL. It stops when the test ends and fails the test if run returned
// an error.
func startQuotad(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, append([]string{"--listen", "127.0.0.1:0"}, args...), func(string) string { return "" }, pw, io.Discard)
		pw.CloseWithError(errors.New("quotad exited"))
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run returned %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("quotad did not stop within 15s")
		}
	})
	lines := bufio.NewScanner(pr)
	if !lines.Scan() {
		t.Fatalf("quotad printed nothing: %v", lines.Err())
	}
	first := lines.Text()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	const marker = "quotad listening on "
	if !strings.HasPrefix(first, marker) {
		t.Fatalf("first line %q does not say where quotad listens", first)
	}
	return strings.Fields(strings.TrimPrefix(first, marker))[0]
}

type checkJSON struct {
	Allowed    *bool  `json:"allowed"`
	Limit      string `json:"limit"`
	Remaining  string `json:"remaining"`
	RetryAfter string `json:"retryAfter"`
	Source     string `json:"source"`
}

func postCheck(t *testing.T, base, body string) checkJSON {
	t.Helper()
	resp, err := http.Post(base+"/quotad.v1.QuotaService/Check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	var out checkJSON
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	if out.Allowed == nil || out.Limit == "" || out.Remaining == "" {
		t.Fatalf("response %s lacks allowed, limit or remaining", raw)
	}
	return out
}

// The README's curl example: five allowed, the sixth denied with a
// retry_after, on each store.
func TestRunServesTheREADMEExample(t *testing.T) {
	r := redistest.Start(t)
	for name, args := range map[string][]string{"memory": nil, "redis": {"--redis", r.URL()}} {
		t.Run(name, func(t *testing.T) {
			base := startQuotad(t, args...)
			body := `{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}`
			for i := range 5 {
				if got := postCheck(t, base, body); !*got.Allowed {
					t.Fatalf("check %d denied: %+v", i+1, got)
				}
			}
			got := postCheck(t, base, body)
			if *got.Allowed || got.Remaining != "0" || got.RetryAfter == "" || got.RetryAfter == "0s" || got.Source != "SOURCE_STORE" {
				t.Fatalf("sixth check: %+v, want denied with remaining 0 and a retry_after from the store", got)
			}
		})
	}
}

func TestRunServesConfiguredPolicies(t *testing.T) {
	path := writeFile(t, "quotad.yaml", `
policies:
  - name: api
    algorithm: token_bucket
    limit: 2
    period: 1m
`)
	base := startQuotad(t, "--config", path, "--inline-limits=false")
	body := `{"policy":"api","key":"k"}`
	for range 2 {
		if got := postCheck(t, base, body); !*got.Allowed {
			t.Fatalf("denied early: %+v", got)
		}
	}
	if got := postCheck(t, base, body); *got.Allowed {
		t.Fatalf("third check allowed: %+v", got)
	}
	resp, err := http.Post(base+"/quotad.v1.QuotaService/Check", "application/json",
		strings.NewReader(`{"policy":"x","key":"k","limit":{"algorithm":"ALGORITHM_GCRA","limit":"5","period":"1s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("inline limit with --inline-limits=false: status %d, want 403", resp.StatusCode)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestConfigPrecedence(t *testing.T) {
	path := writeFile(t, "q.yaml", "listen: file:1\nkey_prefix: fromfile\nlog_level: warn\n")
	env := map[string]string{"QUOTAD_LISTEN": "env:2", "QUOTAD_KEY_PREFIX": "fromenv"}
	c, err := loadConfig([]string{"--config", path, "--listen", "flag:3"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "flag:3" || c.KeyPrefix != "fromenv" || c.LogLevel != "warn" {
		t.Fatalf("got listen %q key_prefix %q log_level %q; want flag over env over file", c.Listen, c.KeyPrefix, c.LogLevel)
	}
	d, err := loadConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.Listen != ":8080" || d.usesRedis() || !d.InlineLimits {
		t.Fatalf("defaults: %+v", d)
	}
}

func TestLeaseAndCacheSettings(t *testing.T) {
	path := writeFile(t, "q.yaml", "lease:\n  horizon: 50ms\n  hold: 1s\n  max_fraction: 0.1\ndenied_cache:\n  max_bytes: 1048576\n"+
		"policies:\n  - name: a\n    algorithm: gcra\n    limit: 5\n    period: 1s\n    lease: off\n")
	c, err := loadConfig([]string{"--config", path, "--lease-hold", "2s"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := node.LeaseConfig{Horizon: 50 * time.Millisecond, Hold: 2 * time.Second, MaxFraction: 0.1}
	if c.Lease != want || c.DeniedCache.MaxBytes != 1<<20 || len(c.Policies) != 1 || c.Policies[0].Lease != node.LeaseOff {
		t.Fatalf("lease %+v, denied cache %+v, policies %+v", c.Lease, c.DeniedCache, c.Policies)
	}
}

// Every bad configuration stops quotad with one error that names the
// source, the line where there is one, and the field.
func TestConfigErrors(t *testing.T) {
	policy := "policies:\n  - name: a\n    algorithm: fixed_window\n    limit: 5\n    period: 1m\n"
	cases := []struct {
		name, file string
		args       []string
		env        map[string]string
		want       []string
	}{
		{name: "unknown top-level field", file: "listen: :1\nlisten_addr: :2\n", want: []string{"q.yaml: line 2: listen_addr: unknown field at the top level (known: listen, redis,"}},
		{name: "unknown policy field", file: policy + "    burts: 3\n", want: []string{"q.yaml: line 6: policies[0].burts: unknown field in policies[0] (known: name, algorithm, limit, period, burst, on_store_error, lease)"}},
		{name: "wrong type", file: "policies:\n  - name: a\n    algorithm: gcra\n    limit: lots\n    period: 1s\n", want: []string{`q.yaml: line 4: policies[0].limit: want a whole number, got "lots"`}},
		{name: "bad duration", file: "policies:\n  - name: a\n    algorithm: gcra\n    limit: 5\n    period: 5 minutes\n", want: []string{`q.yaml: line 5: policies[0].period: invalid duration "5 minutes"`}},
		{name: "duplicate policy", file: policy + "  - name: a\n    algorithm: gcra\n    limit: 1\n    period: 1s\n", want: []string{`q.yaml: line 6: policies[1].name: duplicate policy "a" (first defined on line 2)`}},
		{name: "unknown algorithm", file: "policies:\n  - name: a\n    algorithm: leaky\n    limit: 5\n    period: 1s\n", want: []string{`q.yaml: line 3: policies[0].algorithm: unknown algorithm "leaky"`}},
		{name: "missing algorithm", file: "policies:\n  - name: a\n    limit: 5\n    period: 1s\n", want: []string{"q.yaml: line 2: policies[0].algorithm: missing"}},
		{name: "zero limit", file: "policies:\n  - name: a\n    algorithm: gcra\n    period: 1s\n", want: []string{"q.yaml: line 2: policies[0].limit: invalid limit: 0 must be > 0"}},
		{name: "missing period", file: "policies:\n  - name: a\n    algorithm: gcra\n    limit: 5\n", want: []string{"q.yaml: line 2: policies[0].period: invalid period"}},
		{name: "bad policy name", file: "policies:\n  - name: a b\n    algorithm: gcra\n    limit: 5\n    period: 1s\n", want: []string{`q.yaml: line 2: policies[0].name: invalid policy name: "a b"`}},
		{name: "bad failure mode", file: policy + "    on_store_error: maybe\n", want: []string{`q.yaml: line 6: policies[0].on_store_error: invalid failure mode "maybe"`}},
		{name: "burst on a window", file: policy + "    burst: 3\n", want: []string{"q.yaml: line 6: policies[0].burst: invalid burst: fixed_window has no burst"}},
		{name: "policy not a mapping", file: "policies:\n  - api\n", want: []string{`q.yaml: line 2: policies[0]: want a mapping of name, algorithm, limit, period, burst, on_store_error, lease, got "api"`}},
		{name: "missing file", args: []string{"--config", "/nonexistent/q.yaml"}, want: []string{"/nonexistent/q.yaml"}},
		{name: "bad flag duration", args: []string{"--redis-timeout", "fast"}, want: []string{"--redis-timeout", "fast"}},
		{name: "zero connect timeout", args: []string{"--redis-connect-timeout", "0s"}, want: []string{"redis connect timeout", "0s must be > 0"}},
		{name: "bad bool flag", args: []string{"--inline-limits=maybe"}, want: []string{"--inline-limits", "maybe"}},
		{name: "bad failure mode flag", args: []string{"--default-on-store-error", "sideways"}, want: []string{"--default-on-store-error", "sideways"}},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: []string{"log level", "loud"}},
		{name: "bad redis url", args: []string{"--redis", "http://x"}, want: []string{"redis url"}},
		{name: "bad env", env: map[string]string{"QUOTAD_REDIS_TIMEOUT": "soon"}, want: []string{"QUOTAD_REDIS_TIMEOUT", "soon"}},
		{name: "prefix with braces", args: []string{"--key-prefix", "a{b"}, want: []string{"key_prefix"}},
		{name: "bad lease mode", file: policy + "    lease: sometimes\n", want: []string{`q.yaml: line 6: policies[0].lease: invalid config: "sometimes" (want auto or off)`}},
		{name: "lease fraction above 1", file: "lease:\n  max_fraction: 2\n", want: []string{"q.yaml: line 2: lease.max_fraction: invalid config: 2 must be in (0, 1]"}},
		{name: "unknown lease field", file: "lease:\n  horizon: 1s\n  holds: 2s\n", want: []string{"q.yaml: line 3: lease.holds: unknown field in lease (known: horizon, hold, max_fraction, max_keys)"}},
		{name: "unknown console field", file: "console:\n  enabled: true\n  show_key: false\n", want: []string{"q.yaml: line 3: console.show_key: unknown field in console (known: enabled, show_keys)"}},
		{name: "bad console flag", args: []string{"--console-show-keys=sometimes"}, want: []string{"--console-show-keys", "sometimes"}},
		{name: "hold under horizon", args: []string{"--lease-horizon", "1s", "--lease-hold", "100ms"}, want: []string{"lease hold", "horizon"}},
		{name: "bad lease fraction flag", args: []string{"--lease-max-fraction", "most"}, want: []string{"--lease-max-fraction", "most"}},
		{name: "denied cache sized twice", args: []string{"--denied-cache-entries", "10", "--denied-cache-bytes", "100000"}, want: []string{"denied cache", "at most one"}},
		{name: "negative denied cache", file: "denied_cache:\n  max_entries: -1\n", want: []string{"q.yaml: line 2: denied_cache.max_entries: invalid config: -1 must be 1 to"}},
		{name: "two redis deployments", args: []string{"--redis", "redis://a:1", "--redis-cluster", "b:1,c:1"}, want: []string{"redis", "only one"}},
		{name: "sentinel without master", args: []string{"--redis-sentinel", "a:26379"}, want: []string{"master name"}},
		{name: "cluster address without port", file: "redis:\n  cluster: [a:1, b]\n", want: []string{`q.yaml: line 2: redis.cluster: redis cluster address "b"`, "host:port"}},
		{name: "empty address in list", args: []string{"--redis-cluster", "a:1,,b:1"}, want: []string{"--redis-cluster", "empty address"}},
		{name: "password without redis", env: map[string]string{"QUOTAD_REDIS_PASSWORD": "s3cret"}, want: []string{"no Redis"}},
		{name: "password beside a url", args: []string{"--redis", "redis://a:1/0", "--redis-password", "x"}, want: []string{"URL carries its own"}},
		{name: "unknown redis field", file: "redis:\n  url: redis://a:1\n  adress: b:1\n", want: []string{"q.yaml: line 3: redis.adress: unknown field in redis (known: url, cluster,"}},
		{name: "bad redis db", args: []string{"--redis-db", "one"}, want: []string{"--redis-db", "one"}},
		{name: "negative breaker failures", file: "breaker:\n  failures: -1\n", want: []string{"q.yaml: line 2: breaker.failures: invalid config: -1 must not be negative"}},
		{name: "bad breaker probe", args: []string{"--breaker-probe-every", "often"}, want: []string{"--breaker-probe-every", "often"}},
		{name: "tls ca without tls", args: []string{"--redis", "redis://a:1/0", "--redis-tls-ca", "/ca.pem"}, want: []string{"tls ca", "does not use TLS"}},
		{name: "batch above 1000", args: []string{"--max-batch", "5000"}, want: []string{"max batch", "5000", "1 to 1000"}},
		{name: "negative request bytes", file: "max_request_bytes: -1\n", want: []string{"q.yaml: line 1: max_request_bytes: invalid config: -1 must be > 0"}},
		{name: "second yaml document", file: "listen: :1\n---\nlisten: :2\n", want: []string{"q.yaml: line 2: a second YAML document"}},
		{name: "fractional limit", file: "policies:\n  - name: a\n    algorithm: gcra\n    limit: 100.5\n    period: 1s\n", want: []string{"q.yaml: line 4: policies[0].limit: want a whole number, got 100.5"}},
		{name: "fractional burst", file: "policies:\n  - name: a\n    algorithm: token_bucket\n    limit: 10\n    burst: 2.7\n    period: 1s\n", want: []string{"q.yaml: line 5: policies[0].burst: want a whole number, got 2.7"}},
		{name: "fractional max batch", file: "max_batch: 10.9\n", want: []string{"q.yaml: line 1: max_batch: want a whole number, got 10.9"}},
		{name: "fractional breaker failures", file: "breaker:\n  failures: 2.5\n", want: []string{"q.yaml: line 2: breaker.failures: want a whole number, got 2.5"}},
		{name: "fractional denied cache", file: "denied_cache:\n  max_entries: 1e3.5\n", want: []string{"q.yaml: line 2: denied_cache.max_entries: want a whole number"}},
		{name: "bad indent on line 7", file: "listen: \":1\"\nkey_prefix: q\npolicies:\n  - name: a\n    algorithm: gcra\n    limit: 5\n   period: 1s\n", want: []string{"q.yaml: line 7: YAML syntax:"}},
		{name: "bad indent in a mapping", file: "listen: \":1\"\nredis:\n  url: redis://a:1\n timeout: 1s\n", want: []string{"q.yaml: line 4: YAML syntax: did not find expected key"}},
		{name: "field given twice", file: "listen: :1\nkey_prefix: a\nlisten: :2\n", want: []string{"q.yaml: line 3: listen: given twice (first on line 1)"}},
		{name: "section of the wrong kind", file: "denied_cache: 3\n", want: []string{`q.yaml: line 1: denied_cache: want a mapping of max_entries, max_bytes, got "3"`}},
		{name: "list of the wrong kind", file: "policies:\n  name: a\n", want: []string{"q.yaml: line 2: policies: want a list, got a mapping"}},
		{name: "text of the wrong kind", file: "key_prefix: [a]\n", want: []string{"q.yaml: line 1: key_prefix: want text, got a list"}},
		{name: "bool of the wrong kind", file: "inline_limits: yes\n", want: []string{`q.yaml: line 1: inline_limits: want true or false, got "yes"`}},
		{name: "address list of the wrong kind", file: "redis:\n  cluster: [a:1, [b:2]]\n", want: []string{"q.yaml: line 2: redis.cluster: item 1: want host:port, got a list"}},
		{name: "unknown envoy field", file: "envoy:\n  domains:\n    - domain: x\n      descriptors:\n        - key: a\n          polcy: p\n", want: []string{"q.yaml: line 6: envoy.domains[0].descriptors[0].polcy: unknown field in envoy.domains[0].descriptors[0]"}},
		{name: "envoy rule naming no policy", file: "envoy:\n  domains:\n    - domain: x\n      descriptors:\n        - key: a\n          policy: p\n", want: []string{`q.yaml: line 6: envoy.domains[0].descriptors[0].policy: invalid envoy config: unknown policy "p"`}},
		{name: "aliases expanding without end", file: aliasBomb(), want: []string{"q.yaml: line ", "envoy.domains[0].descriptors[", "more than 100000 YAML nodes"}},
		{name: "merged hold under horizon in the file", file: "lease:\n  horizon: 1s\n  hold: 100ms\n", want: []string{"q.yaml: line 3: lease.hold: invalid config: 100ms must be at least the horizon 1s"}},
		{name: "merged cluster without redis in the file", file: "cluster:\n  addr: 127.0.0.1:0\n", want: []string{"q.yaml: line 1: cluster: --cluster-addr needs Redis"}},
		{name: "merged error a flag overrides", file: "lease:\n  horizon: 1s\n", args: []string{"--lease-hold", "100ms"}, want: []string{"config: lease hold: invalid config: 100ms must be at least the horizon 1s"}},
		{name: "sentinel password without sentinel", args: []string{"--redis", "redis://a:1/0", "--redis-sentinel-password", "x"}, want: []string{"sentinel credentials"}},
		{name: "sentinel password without redis", env: map[string]string{"QUOTAD_REDIS_SENTINEL_PASSWORD": "x"}, want: []string{"no Redis"}},
		{name: "bad pprof addr", args: []string{"--pprof-addr", "6060"}, want: []string{"pprof addr", "6060", "host:port"}},
		{name: "bad grpc transport", args: []string{"--grpc-transport", "fast"}, want: []string{"grpc transport", "fast", "grpc-go or connect"}},
		{name: "bad grpc transport in the file", file: "grpc_transport: netty\n", want: []string{"grpc transport", "netty"}},
		{name: "unknown flag", args: []string{"--lissten", ":1"}, want: []string{"unknown flag --lissten; did you mean --listen? (quotad --help lists every flag)"}},
		{name: "unknown flag near a file key", args: []string{"--redis-ur", "redis://a:1"}, want: []string{"unknown flag --redis-ur; did you mean --redis? (quotad --help lists every flag)"}},
		{name: "a file key as a flag", args: []string{"--redis-url", "redis://a:1"}, want: []string{"unknown flag --redis-url; did you mean --redis? (quotad --help lists every flag)"}},
		{name: "a port alone", args: []string{"--listen", "8080"}, want: []string{`config: listen: "8080" is a port alone; write :8080 (every interface) or 127.0.0.1:8080 (this machine only)`}},
		{name: "bad log format", args: []string{"--log-format", "xml"}, want: []string{`config: log format: "xml": want text or json`}},
		{name: "stray argument", args: []string{"serve"}, want: []string{"serve"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, "q.yaml", tc.file)}, args...)
			}
			_, err := loadConfig(args, func(k string) string { return tc.env[k] }, io.Discard)
			if err == nil {
				t.Fatal("loadConfig accepted a bad configuration")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// aliasBomb is a small file whose aliases expand to a million Envoy rules.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("envoy:\n  domains:\n    - domain: d\n      descriptors:\n        - &l0 {key: k0, unlimited: true}\n")
	for i := 1; i <= 6; i++ {
		fmt.Fprintf(&b, "        - &l%d {key: k%d, descriptors: [%s]}\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 10), ", "))
	}
	return b.String()
}

func TestHelpDocumentsEverySetting(t *testing.T) {
	var out strings.Builder
	_, err := loadConfig([]string{"--help"}, func(string) string { return "" }, &out)
	if !errors.Is(err, errHelp) {
		t.Fatalf("--help returned %v", err)
	}
	for _, s := range settings() {
		if !strings.Contains(out.String(), "-"+s.flag) || !strings.Contains(out.String(), s.env()) {
			t.Errorf("help lacks --%s or %s", s.flag, s.env())
		}
	}
	for _, w := range []string{"-config", "policies:", "token_bucket", "curl"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("help lacks %q", w)
		}
	}
}

// Cluster and Sentinel settings reach redis.Config from the file, the
// environment and flags, and the breaker settings reach node.Config.
func TestRedisDeploymentSettings(t *testing.T) {
	file := writeFile(t, "q.yaml", "redis:\n  sentinel: [s1:26379, s2:26379]\n  master: mymaster\n  db: 2\n  username: app\n  tls: true\n  timeout: 80ms\n  connect_timeout: 3s\nbreaker:\n  failures: 9\n  probe_every: 1s\n")
	c, err := loadConfig([]string{"--config", file, "--breaker-failures", "7"}, func(k string) string {
		return map[string]string{"QUOTAD_REDIS_PASSWORD": "pw"}[k]
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Redis
	if !slices.Equal(r.SentinelAddrs, []string{"s1:26379", "s2:26379"}) || r.MasterName != "mymaster" || r.DB != 2 ||
		r.Username != "app" || r.Password != "pw" || !r.TLS || r.Timeout != 80*time.Millisecond || r.ConnectTimeout != 3*time.Second {
		t.Errorf("redis: %+v", r)
	}
	if b := c.nodeConfig().Breaker; b.Failures != 7 || b.ProbeEvery != time.Second {
		t.Errorf("breaker: %+v", b)
	}
	c, err = loadConfig([]string{"--redis-cluster", "a:7000, b:7001"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Redis.ClusterAddrs, []string{"a:7000", "b:7001"}) || !c.usesRedis() || c.Redis.Timeout != redis.DefaultTimeout ||
		c.Redis.ConnectTimeout != redis.DefaultConnectTimeout {
		t.Errorf("cluster: %+v", c.Redis)
	}
}
