package envoycompat

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
)

// envoyproxy/ratelimit's integration sequences (its
// test/integration/integration_test.go: testBasicBaseConfig and
// testConfigReload), on its own rules files (testdata/upstream, copied
// unchanged), asked with go-control-plane's client of a built quotad: on
// the embedded store, on redis-server, and as `quotad envoy-ratelimit`
// with upstream's docker-compose environment (only its Redis address, rules
// directory and ports changed) and its integration tests' local cache
// setting.

// upstreamRules returns a rules directory holding upstream's integration
// config files.
func upstreamRules(t *testing.T) (root, dir string) {
	t.Helper()
	root = t.TempDir()
	dir = filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"basic.yaml", "another.yaml"} {
		raw, err := os.ReadFile(filepath.Join("testdata", "upstream", "integration", "config", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, dir
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// upstreamModes starts quotad three ways on a rules directory and returns,
// for each, its address and the directory its rules are read from.
func upstreamModes(t *testing.T) map[string]func(t *testing.T) (addr, dir string) {
	return map[string]func(t *testing.T) (string, string){
		"memory store": func(t *testing.T) (string, string) {
			_, dir := upstreamRules(t)
			addr, _ := runQuotad(t, "--envoy-config-dir", dir)
			return addr, dir
		},
		"redis": func(t *testing.T) (string, string) {
			_, dir := upstreamRules(t)
			addr, _ := runQuotad(t, "--envoy-config-dir", dir, "--redis", redistest.Start(t).URL())
			return addr, dir
		},
		"envoy-ratelimit": func(t *testing.T) (string, string) {
			root, dir := upstreamRules(t)
			cmd := exec.Command(quotadtest.Binary(t), "envoy-ratelimit")
			cmd.Env = []string{"USE_STATSD=false", "LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redistest.Start(t).Addr(),
				"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "MEMCACHE_HOST_PORT=memcached:11211",
				"LOCAL_CACHE_SIZE_IN_BYTES=1000", "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + freePort(t),
				"HOST=127.0.0.1", "PORT=" + freePort(t), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + freePort(t)}
			addr, _ := runCommand(t, cmd)
			return addr, dir
		},
	}
}

// testBasicBaseConfig's sequence: an unknown domain, one hit of a
// 50-a-second limit, 25 hits of a 20-a-minute one (the last five over),
// 15 requests of two descriptors whose hour limit of 10 runs out while the
// minute limit keeps counting, and a reset that counts down.
func TestUpstreamBasicSequence(t *testing.T) {
	for name, start := range upstreamModes(t) {
		t.Run(name, func(t *testing.T) {
			addr, _ := start(t)
			c := dial(t, addr)
			min20 := limit{20, rlsv3.RateLimitResponse_RateLimit_MINUTE, ""}
			hour10 := limit{10, rlsv3.RateLimitResponse_RateLimit_HOUR, ""}

			res := c.call("foo", 1, desc("hello", "world"))
			c.want("an unknown domain", res.GetStatuses()[0], ok, limit{}, 0)

			res = c.call("basic", 1, desc("key1", "foo"))
			c.want("key1", res.GetStatuses()[0], ok, limit{50, rlsv3.RateLimitResponse_RateLimit_SECOND, ""}, 49)

			v := strconv.FormatUint(rand.Uint64(), 10)
			for i := range 25 {
				res = c.call("another", 1, desc("key2", v))
				code, remaining := ok, int64(20-(i+1))
				if i >= 20 {
					code, remaining = over, 0
				}
				if res.GetOverallCode() != code {
					t.Errorf("key2 hit %d: overall %s, want %s", i+1, res.GetOverallCode(), code)
				}
				c.want(fmt.Sprintf("key2 hit %d", i+1), res.GetStatuses()[0], code, min20, remaining)
			}
			m := c.metrics()
			if hits, o := metric(m, "quotad_envoy_hits_total", "quotad_envoy_domain=another", "quotad_envoy_rule=key2"), metric(m, "quotad_envoy_over_limit_total", "quotad_envoy_domain=another", "quotad_envoy_rule=key2"); hits != 25 || o != 5 {
				t.Errorf("key2's statistics: %v hits, %v over the limit; want 25 and 5, as upstream's total_hits and over_limit", hits, o)
			}

			v = strconv.FormatUint(rand.Uint64(), 10)
			for i := range 15 {
				res = c.call("another", 1, desc("key2", v), desc("key3", v))
				code, remaining3 := ok, int64(10-(i+1))
				if i >= 10 {
					code, remaining3 = over, 0
				}
				if res.GetOverallCode() != code {
					t.Errorf("two descriptors, request %d: overall %s, want %s", i+1, res.GetOverallCode(), code)
				}
				c.want(fmt.Sprintf("key2 of request %d", i+1), res.GetStatuses()[0], ok, min20, int64(20-(i+1)))
				c.want(fmt.Sprintf("key3 of request %d", i+1), res.GetStatuses()[1], code, hour10, remaining3)
			}

			first := c.call("another", 1, desc("key4", "durTest")).GetStatuses()[0].GetDurationUntilReset().AsDuration()
			time.Sleep(2 * time.Second)
			second := c.call("another", 1, desc("key4", "durTest")).GetStatuses()[0].GetDurationUntilReset().AsDuration()
			if second >= first {
				t.Errorf("duration_until_reset %s two seconds after %s, want less", second, first)
			}
		})
	}
}

// testConfigReload's sequence: a domain that is not configured answers a
// bare OK; once upstream's reload.yaml is copied into the directory its
// limit applies; once removed, the domain is gone again.
func TestUpstreamConfigReload(t *testing.T) {
	for name, start := range upstreamModes(t) {
		t.Run(name, func(t *testing.T) {
			addr, dir := start(t)
			c := dial(t, addr)
			c.want("before the reload", c.call("reload", 1, desc("block", "foo")).GetStatuses()[0], ok, limit{}, 0)

			raw, err := os.ReadFile(filepath.Join("testdata", "upstream", "integration", "reload.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "reload.yaml"), raw, 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "reload.yaml's rules", func() bool {
				return c.call("reload", 1, desc("key1", "probe")).GetStatuses()[0].GetCurrentLimit() != nil
			})
			res := c.call("reload", 1, desc("key1", "foo"))
			c.want("key1 after the reload", res.GetStatuses()[0], ok, limit{50, rlsv3.RateLimitResponse_RateLimit_SECOND, ""}, 49)

			if err := os.Remove(filepath.Join(dir, "reload.yaml")); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "reload.yaml's rules gone", func() bool {
				return c.call("reload", 1, desc("key1", "probe")).GetStatuses()[0].GetCurrentLimit() == nil
			})
		})
	}
}
