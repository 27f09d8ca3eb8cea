package main

import (
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/memcachedtest"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/testpki"
)

// post sends body to the API's procedure in JSON and returns the status
// and the body of the answer.
func post(t *testing.T, base, procedure, body string) (int, string) {
	t.Helper()
	res, err := http.Post(base+"/quotad.v1.QuotaService/"+procedure, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(raw)
}

// The built quotad on --memcache decides fixed windows in a real
// memcached, refuses the other algorithms per request with a message that
// says what to do, resets a configured policy's key and says it cannot
// reset an inline namespace.
func TestMemcacheStoreOnTheBuiltBinary(t *testing.T) {
	mc := memcachedtest.Start(t)
	cfg := writeFile(t, "q.yaml", "policies:\n  - name: api\n    algorithm: fixed_window\n    limit: 2\n    period: 1h\n")
	base := startBinary(t, "--memcache", mc.Addr(), "--memcache-timeout", "2s", "--config", cfg)

	for i, want := range []string{`"allowed":true`, `"allowed":true`, `"allowed":false`} {
		code, body := post(t, base, "Check", `{"policy":"api","key":"k"}`)
		if code != 200 || !strings.Contains(body, want) || strings.Contains(body, "FAIL_") {
			t.Fatalf("check %d: %d %s, want %s from the store", i+1, code, body, want)
		}
	}
	code, body := post(t, base, "Check", `{"policy":"inline","key":"k","limit":{"algorithm":"ALGORITHM_TOKEN_BUCKET","limit":"5","period":"1s"}}`)
	if code != 400 || !strings.Contains(body, "invalid_argument") || !strings.Contains(body, "memcache keeps fixed windows only") {
		t.Fatalf("an inline token bucket: %d %s, want invalid_argument saying memcache keeps fixed windows only", code, body)
	}
	code, body = post(t, base, "Check", `{"policy":"inline","key":"k","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"1s"}}`)
	if code != 200 || !strings.Contains(body, `"allowed":true`) {
		t.Fatalf("an inline fixed window: %d %s", code, body)
	}
	if code, body := post(t, base, "Reset", `{"policy":"api","key":"k"}`); code != 200 {
		t.Fatalf("reset of api/k: %d %s", code, body)
	}
	if code, body := post(t, base, "Check", `{"policy":"api","key":"k"}`); code != 200 || !strings.Contains(body, `"allowed":true`) {
		t.Fatalf("check after the reset: %d %s, want allowed", code, body)
	}
	code, body = post(t, base, "Reset", `{"policy":"inline","key":"k"}`)
	if code != 501 || !strings.Contains(body, "unimplemented") || !strings.Contains(body, "memcached cannot list") {
		t.Fatalf("reset of an inline namespace: %d %s, want unimplemented saying why", code, body)
	}
}

// A policy memcached cannot keep stops quotad at start, naming the
// file, the line and field at fault, the policy and what to change.
func TestMemcacheRefusesOtherAlgorithmsAtStart(t *testing.T) {
	cfg := writeFile(t, "q.yaml", "policies:\n  - name: api\n    algorithm: sliding_window_log\n    limit: 2\n    period: 1h\n")
	err := run(t.Context(), []string{"--memcache", "127.0.0.1:1", "--config", cfg}, func(string) string { return "" }, io.Discard, io.Discard)
	want := "config " + cfg + ": line 3: policies[0].algorithm: sliding_window_log (policy api): memcache keeps fixed windows only; make it fixed_window, or keep its state in Redis (--redis instead of --memcache)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("started with a sliding window log on memcache: %v\nwant %q", err, want)
	}
}

// `quotad envoy-ratelimit` with BACKEND_TYPE=memcache: two instances on
// one memcached admit the limit together, no more, and a memcached that is
// down answers OK (quotad's failure mode, open by default) rather than an
// error; a key the node knows is over its limit stays denied meanwhile,
// by its remembered denial.
func TestEnvoyRatelimitOnMemcache(t *testing.T) {
	mc := memcachedtest.Start(t)
	rules := "domain: rl\ndescriptors:\n  - key: category\n    value: account\n    rate_limit: {unit: hour, requests_per_unit: 3}\n" +
		"  - key: category\n    value: billing\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
	env := []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=" + mc.Addr(), "REDIS_URL=redis:6379"}
	a, b := startRatelimit(t, rules, env...), startRatelimit(t, rules, env...)
	if !a.stdout.contains("store: memcache " + mc.Addr()) {
		t.Errorf("the start does not name the memcached store:\n%s", a.stdout.tail())
	}
	if !a.stderr.contains("REDIS_URL is not needed: used only with BACKEND_TYPE=redis") {
		t.Errorf("the start does not say REDIS_URL is not needed:\n%s", a.stderr.tail())
	}
	quotadtest.AwayFromWindowEnd(t, time.Hour, time.Minute)
	var statuses []int
	for i := range 8 {
		statuses = append(statuses, []*ratelimitProc{a, b}[i%2].askJSON(t))
	}
	if want := []int{200, 200, 200, 429, 429, 429, 429, 429}; !slices.Equal(statuses, want) {
		t.Fatalf("two instances answered %v, want %v: the limit of 3 once between them", statuses, want)
	}
	mc.Kill()
	if got := a.askJSONFor(t, "billing"); got != 200 {
		t.Fatalf("with memcached down: %d, want 200 (the failure mode, open)", got)
	}
	if got := a.askJSON(t); got != 429 {
		t.Fatalf("a key over its limit, with memcached down: %d, want 429 (its remembered denial)", got)
	}
}

// `quotad envoy-ratelimit` with MEMCACHE_TLS=true and its files reaches a
// memcached that serves TLS and requires a client certificate.
func TestEnvoyRatelimitOnMemcacheOverTLS(t *testing.T) {
	ca := testpki.NewCA(t, "memcached ca")
	server, client := ca.Issue(t, "127.0.0.1", true), ca.Issue(t, "quotad", false)
	mc := memcachedtest.Start(t, memcachedtest.WithTLS(server.CertPEM, server.KeyPEM, ca.PEM, true))
	caFile, certFile, keyFile := writeFile(t, "ca.pem", string(ca.PEM)), writeFile(t, "client.pem", string(client.CertPEM)), writeFile(t, "client.key", string(client.KeyPEM))
	rules := "domain: rl\ndescriptors:\n  - key: category\n    value: account\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	p := startRatelimit(t, rules, "USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT="+mc.TLSAddr(),
		"MEMCACHE_TLS=true", "MEMCACHE_TLS_CACERT="+caFile, "MEMCACHE_TLS_CLIENT_CERT="+certFile, "MEMCACHE_TLS_CLIENT_KEY="+keyFile)
	quotadtest.AwayFromWindowEnd(t, time.Hour, time.Minute)
	if a, b := p.askJSON(t), p.askJSON(t); a != 200 || b != 429 {
		t.Fatalf("over TLS: %d then %d, want 200 then 429 from memcached's count", a, b)
	}
	// The count is memcached's: a second instance over TLS sees it.
	q := startRatelimit(t, rules, "USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT="+mc.TLSAddr(),
		"MEMCACHE_TLS=true", "MEMCACHE_TLS_CACERT="+caFile, "MEMCACHE_TLS_CLIENT_CERT="+certFile, "MEMCACHE_TLS_CLIENT_KEY="+keyFile)
	if got := q.askJSON(t); got != 429 {
		t.Fatalf("a second instance over TLS: %d, want 429: the first one's hit is counted in memcached", got)
	}
}

// The memcached settings say what is missing or in conflict: a second
// store, or TLS settings without what they need.
func TestMemcacheSettingsSayWhatIsMissing(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--memcache", "m:1", "--redis", "redis://r:1"}, "memcache: --memcache and Redis (--redis, --redis-cluster or --redis-sentinel) are both set; choose one store"},
		{[]string{"--memcache-tls"}, "memcache: --memcache-tls and its files are set but no memcached is (set --memcache)"},
		{[]string{"--memcache", "m:1", "--memcache-tls-ca", "/ca.pem"}, "memcache: --memcache-tls-ca, --memcache-tls-cert-file, --memcache-tls-key-file and --memcache-tls-skip-hostname-verification need --memcache-tls"},
		{[]string{"--memcache", "m:1", "--memcache-tls", "--memcache-tls-cert-file", "/c.pem"}, "memcache: --memcache-tls-cert-file and --memcache-tls-key-file go together: set both, or neither"},
		{[]string{"--memcache", "m:1", "--memcache-tls", "--memcache-tls-ca", "/nonexistent/ca.pem"}, "memcache tls ca file"},
	} {
		err := run(t.Context(), append([]string{"--listen", "127.0.0.1:0"}, c.args...), func(string) string { return "" }, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// A reload that brings a policy memcached cannot keep is refused, saying
// why, and the running policy stays in force.
func TestMemcacheRefusesOtherAlgorithmsOnReload(t *testing.T) {
	mc := memcachedtest.Start(t)
	path := writeFile(t, "q.yaml", "policies:\n  - {name: a, algorithm: fixed_window, limit: 5, period: 1h}\n")
	p := startProcess(t, "--memcache", mc.Addr(), "--memcache-timeout", "2s", "--config", path)
	if err := os.WriteFile(path, []byte("policies:\n  - {name: a, algorithm: token_bucket, limit: 7, period: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.tail(), "config reload failed") {
		if time.Now().After(deadline) {
			t.Fatalf("no refused reload; stderr:\n%s", p.stderr.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if logged := p.stderr.tail(); !strings.Contains(logged, "memcache keeps fixed windows only") {
		t.Errorf("the refused reload does not say why:\n%s", logged)
	}
	if got := postCheck(t, p.URL, `{"policy":"a","key":"k"}`); got.Limit != "5" || got.Allowed == nil || !*got.Allowed {
		t.Errorf("after the refused reload: %+v, want the running fixed window of 5", got)
	}
}
