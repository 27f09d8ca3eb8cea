package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/internal/redistest"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// configMapDir is a directory laid out as Kubernetes mounts a ConfigMap:
// the file is a symlink through ..data, itself a symlink to a timestamped
// directory that an update replaces by swapping ..data.
type configMapDir struct {
	dir     string
	version int
}

func newConfigMapDir(t *testing.T, content string) *configMapDir {
	t.Helper()
	d := &configMapDir{dir: t.TempDir()}
	d.update(t, content)
	if err := os.Symlink(filepath.Join("..data", "quotad.yaml"), filepath.Join(d.dir, "quotad.yaml")); err != nil {
		t.Fatal(err)
	}
	return d
}

// path is the file quotad is given.
func (d *configMapDir) path() string { return filepath.Join(d.dir, "quotad.yaml") }

// update writes content into a new timestamped directory and points ..data
// at it in one rename, as the kubelet does.
func (d *configMapDir) update(t *testing.T, content string) {
	t.Helper()
	d.version++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", d.version, time.Now().UnixNano())
	if err := os.Mkdir(filepath.Join(d.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.dir, ts, "quotad.yaml"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// reloadConfig is a config with policy api of apiLimit per hour, and an
// Envoy rule limiting descriptor client=... by policy per-client of
// clientLimit per hour.
func reloadConfig(apiLimit, clientLimit int) string {
	return fmt.Sprintf(`# config version for the reload test
policies:
  - name: api
    algorithm: fixed_window
    limit: %d
    period: 1h
  - name: per-client
    algorithm: token_bucket
    limit: %d
    period: 1h
envoy:
  domains:
    - domain: edge
      descriptors:
        - key: client
          policy: per-client
`, apiLimit, clientLimit)
}

type clusterConfigJSON struct {
	Config struct {
		Generation int64  `json:"generation"`
		Hash       string `json:"hash"`
		Policies   int    `json:"policies"`
	} `json:"config"`
}

func getConfigVersion(t *testing.T, base string) clusterConfigJSON {
	t.Helper()
	resp, err := http.Get(base + "/cluster")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out clusterConfigJSON
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// quotad runs with a config file under load; the
// file is replaced by a symlink swap as Kubernetes does, with changed
// policies and Envoy rules; within 5 s checks follow the new limits and no
// request fails during the swap. A broken file is not applied: the old
// config stays, the error is logged with file, line and field, and the
// failure counter goes up by one. SIGHUP reloads and the process keeps
// running.
func TestReloadUnderLoad(t *testing.T) {
	r := redistest.Start(t)
	v1 := reloadConfig(1_000_000, 100)
	cm := newConfigMapDir(t, v1)
	p := startProcess(t, "--config", cm.path(), "--redis", r.URL(), "--redis-timeout", "2s")

	api := quotadv1connect.NewQuotaServiceClient(&http.Client{Timeout: 10 * time.Second}, p.URL)
	h2c := &http.Transport{Protocols: new(http.Protocols)}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(h2c.CloseIdleConnections)
	rls := ratelimitv3connect.NewRateLimitServiceClient(&http.Client{Transport: h2c, Timeout: 10 * time.Second}, p.URL, connect.WithGRPC())
	ctx := context.Background()

	// The load: Checks of api on a few keys over Connect, and Envoy
	// requests over gRPC, without pause. Every limit seen is recorded.
	var apiLimit, clientLimit atomic.Int64
	var requests, failures atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	fail := func(err error) {
		failures.Add(1)
		firstFailure.CompareAndSwap(nil, err.Error())
	}
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("k%d-%d", i, k%8)
				if i%2 == 0 {
					res, err := api.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "api", Key: key}))
					if err != nil {
						fail(err)
						continue
					}
					if !res.Msg.GetAllowed() {
						fail(fmt.Errorf("api check denied: %v", res.Msg))
					}
					apiLimit.Store(res.Msg.GetLimit())
				} else {
					res, err := rls.ShouldRateLimit(ctx, connect.NewRequest(&rlsv3.RateLimitRequest{Domain: "edge",
						Descriptors: []*rlscommonv3.RateLimitDescriptor{{Entries: []*rlscommonv3.RateLimitDescriptor_Entry{{Key: "client", Value: key}}}}}))
					if err != nil {
						fail(err)
						continue
					}
					clientLimit.Store(int64(res.Msg.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()))
				}
				requests.Add(1)
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	waitFor := func(what string, within time.Duration, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > within {
				t.Fatalf("%s: not within %s; stderr:\n%s", what, within, p.stderr.tail())
			}
			time.Sleep(10 * time.Millisecond)
		}
		return time.Since(start)
	}
	waitFor("load under way", 30*time.Second, func() bool { return requests.Load() > 100 && apiLimit.Load() == 1_000_000 && clientLimit.Load() == 100 })
	if v := getConfigVersion(t, p.URL); v.Config.Generation != 1 || v.Config.Hash != sha256Hex(v1) || v.Config.Policies != 2 {
		t.Fatalf("/cluster config at start: %+v, want generation 1 and the file's SHA-256", v.Config)
	}
	failuresBefore := metricOf(t, p.URL, "failure")

	// The swap: new limits for the API's policy and the Envoy rule's.
	v2 := reloadConfig(2_000_000, 200)
	cm.update(t, v2)
	took := waitFor("checks follow the swapped file", 5*time.Second, func() bool {
		return apiLimit.Load() == 2_000_000 && clientLimit.Load() == 200
	})
	t.Logf("checks followed the symlink swap after %s, %d requests so far", took.Round(time.Millisecond), requests.Load())
	sent := requests.Load()
	waitFor("more load after the swap", 30*time.Second, func() bool { return requests.Load() > sent+100 })
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d requests failed around the swap, first: %v", n, firstFailure.Load())
	}
	if v := getConfigVersion(t, p.URL); v.Config.Generation != 2 || v.Config.Hash != sha256Hex(v2) {
		t.Fatalf("/cluster config after the swap: %+v", v.Config)
	}

	// A broken file: a fraction on line 5. The old config stays in force.
	broken := strings.Replace(reloadConfig(3_000_000, 300), "limit: 3000000", "limit: 3000000.5", 1)
	cm.update(t, broken)
	waitFor("the broken file's error in the log", 5*time.Second, func() bool {
		return strings.Contains(p.stderr.tail(), "config reload failed")
	})
	logged := p.stderr.tail()
	for _, w := range []string{"file=" + cm.path(), "line=5", "field=policies[0].limit", "want a whole number, got 3000000.5"} {
		if !strings.Contains(logged, w) {
			t.Errorf("the reload error lacks %q:\n%s", w, logged)
		}
	}
	if got := metricOf(t, p.URL, "failure"); got != failuresBefore+1 {
		t.Errorf("quotad_config_reloads_total{result=\"failure\"} = %v, want %v", got, failuresBefore+1)
	}
	sent = requests.Load()
	waitFor("load after the broken file", 30*time.Second, func() bool { return requests.Load() > sent+100 })
	if apiLimit.Load() != 2_000_000 || clientLimit.Load() != 200 {
		t.Fatalf("after the broken file checks see limits %d and %d, want the old config's 2000000 and 200", apiLimit.Load(), clientLimit.Load())
	}
	// A refused file is reported once, not at every poll.
	time.Sleep(2 * configPollInterval)
	if got := metricOf(t, p.URL, "failure"); got != failuresBefore+1 {
		t.Errorf("the broken file was counted %v times, want once", got-failuresBefore)
	}

	// A good file again, then SIGHUP, twice: each reloads, quotad lives on.
	v3 := reloadConfig(3_000_000, 300)
	cm.update(t, v3)
	waitFor("the repaired file", 5*time.Second, func() bool { return apiLimit.Load() == 3_000_000 && clientLimit.Load() == 300 })
	successes := metricOf(t, p.URL, "success")
	for range 2 {
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("SIGHUP reloads", 5*time.Second, func() bool {
		return metricOf(t, p.URL, "success") >= successes+1 && strings.Contains(p.stderr.tail(), "trigger=SIGHUP")
	})
	select {
	case err := <-p.exited:
		t.Fatalf("quotad exited after SIGHUP: %v", err)
	default:
	}
	if v := getConfigVersion(t, p.URL); v.Config.Hash != sha256Hex(v3) || v.Config.Generation < 4 {
		t.Fatalf("/cluster config after SIGHUP: %+v", v.Config)
	}
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d requests failed, first: %v", n, firstFailure.Load())
	}
	t.Logf("%d requests, none failed", requests.Load())
}

// metricOf is quotad_config_reloads_total{result=...} on base's /metrics.
func metricOf(t *testing.T, base, result string) float64 {
	t.Helper()
	v, ok := metricValue(scrape(t, base), "quotad_config_reloads_total", map[string]string{"result": result})
	if !ok {
		t.Fatalf("no quotad_config_reloads_total{result=%q}", result)
	}
	return v
}

// Settings that need a restart are reported and keep their running
// values; the rest of the reload applies. A new log level applies at once.
func TestReloadReportsSettingsThatNeedARestart(t *testing.T) {
	path := writeFile(t, "q.yaml", "key_prefix: one\npolicies:\n  - {name: a, algorithm: gcra, limit: 5, period: 1s}\n")
	p := startProcess(t, "--config", path)
	if err := os.WriteFile(path, []byte("key_prefix: two\nlog_level: debug\npolicies:\n  - {name: a, algorithm: gcra, limit: 7, period: 1s}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.stderr.tail(), "config reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload; stderr:\n%s", p.stderr.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
	logged := p.stderr.tail()
	if !strings.Contains(logged, "change only with a restart") || !strings.Contains(logged, "settings=key_prefix") {
		t.Errorf("the key prefix change is not reported as needing a restart:\n%s", logged)
	}
	got := postCheck(t, p.URL, `{"policy":"a","key":"k"}`)
	if got.Limit != "7" {
		t.Errorf("limit %s after the reload, want 7", got.Limit)
	}
	// Debug level now: the check logged its decision.
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(p.stderr.tail(), "msg=decision policy=a") {
		if time.Now().After(deadline) {
			t.Fatalf("no debug line after log_level: debug was reloaded:\n%s", p.stderr.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
