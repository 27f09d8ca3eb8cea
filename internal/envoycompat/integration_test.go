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
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/quotad/quotad/internal/memcachedtest"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
)

// envoyproxy/ratelimit's integration sequences (its
// test/integration/integration_test.go: testBasicBaseConfig and
// testConfigReload), on its own rules files (testdata/upstream, copied
// unchanged), asked with go-control-plane's client of a built quotad: on
// the embedded store, on redis-server, on memcached, and as `quotad
// envoy-ratelimit` with upstream's docker-compose environment (only its
// Redis address, rules directory and ports changed) and its integration
// tests' local cache setting, with the rules as files and from an xDS
// management server, and with BACKEND_TYPE=memcache on two memcached
// servers, as upstream's TestMultiNodeMemcache.

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

// upstreamQuotad is quotad serving upstream's integration rules, and how
// to add and remove upstream's reload.yaml (its domain "reload").
type upstreamQuotad struct {
	addr                    string
	addReload, removeReload func(t *testing.T)
}

// upstreamModes starts quotad six ways on upstream's integration rules.
func upstreamModes() map[string]func(t *testing.T) upstreamQuotad {
	files := func(t *testing.T, dir string) upstreamQuotad {
		return upstreamQuotad{
			addReload: func(t *testing.T) {
				raw, err := os.ReadFile(filepath.Join("testdata", "upstream", "integration", "reload.yaml"))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "reload.yaml"), raw, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			removeReload: func(t *testing.T) {
				if err := os.Remove(filepath.Join(dir, "reload.yaml")); err != nil {
					t.Fatal(err)
				}
			},
		}
	}
	ratelimitEnv := func(t *testing.T, extra ...string) []string {
		return append([]string{"USE_STATSD=false", "LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redistest.Start(t).Addr(),
			"RUNTIME_SUBDIRECTORY=ratelimit", "MEMCACHE_HOST_PORT=memcached:11211",
			"LOCAL_CACHE_SIZE_IN_BYTES=1000", "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + freePort(t),
			"HOST=127.0.0.1", "PORT=" + freePort(t), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + freePort(t)}, extra...)
	}
	return map[string]func(t *testing.T) upstreamQuotad{
		"memory store": func(t *testing.T) upstreamQuotad {
			_, dir := upstreamRules(t)
			q := files(t, dir)
			q.addr, _ = runQuotad(t, "--envoy-config-dir", dir)
			return q
		},
		"redis": func(t *testing.T) upstreamQuotad {
			_, dir := upstreamRules(t)
			q := files(t, dir)
			q.addr, _ = runQuotad(t, "--envoy-config-dir", dir, "--redis", redistest.Start(t).URL())
			return q
		},
		"memcache": func(t *testing.T) upstreamQuotad {
			_, dir := upstreamRules(t)
			q := files(t, dir)
			q.addr, _ = runQuotad(t, "--envoy-config-dir", dir, "--memcache", memcachedtest.Start(t).Addr())
			return q
		},
		// As upstream's TestMultiNodeMemcache: BACKEND_TYPE=memcache over
		// two memcached servers, the keys spread between them, with its
		// MemcacheWithPrefix's key prefix and its idle connections.
		"envoy-ratelimit on memcache": func(t *testing.T) upstreamQuotad {
			root, dir := upstreamRules(t)
			q := files(t, dir)
			cmd := exec.Command(quotadtest.Binary(t), "envoy-ratelimit")
			cmd.Env = []string{"USE_STATSD=false", "LOG_LEVEL=debug", "BACKEND_TYPE=memcache",
				"MEMCACHE_HOST_PORT=" + memcachedtest.Start(t).Addr() + "," + memcachedtest.Start(t).Addr(), "MEMCACHE_MAX_IDLE_CONNS=100", "CACHE_KEY_PREFIX=prefix:",
				"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "LOCAL_CACHE_SIZE_IN_BYTES=1000",
				"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + freePort(t), "HOST=127.0.0.1", "PORT=" + freePort(t),
				"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + freePort(t)}
			q.addr, _ = runCommand(t, cmd)
			return q
		},
		"envoy-ratelimit": func(t *testing.T) upstreamQuotad {
			root, dir := upstreamRules(t)
			q := files(t, dir)
			cmd := exec.Command(quotadtest.Binary(t), "envoy-ratelimit")
			cmd.Env = ratelimitEnv(t, "RUNTIME_ROOT="+root)
			q.addr, _ = runCommand(t, cmd)
			return q
		},
		// As upstream's xds_sotw_integration_test: the same rules from a
		// management server, snapshot 2 adding the domain "reload" and
		// snapshot 3 taking it away.
		"envoy-ratelimit over xds": func(t *testing.T) upstreamQuotad {
			m := serveManagement(t, "127.0.0.1:0", cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil))
			m.node = "init-test-node"
			m.set("1", upstreamXDSRules()...)
			cmd := exec.Command(quotadtest.Binary(t), "envoy-ratelimit")
			cmd.Env = ratelimitEnv(t, "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID=init-test-node", "CONFIG_GRPC_XDS_SERVER_URL="+m.addr)
			addr, _ := runCommand(t, cmd)
			// It serves before the first snapshot arrives (unknown domains
			// answered OK, as upstream's): the sequences start once the
			// rules are in force.
			c := dial(t, addr)
			eventually(t, 10*time.Second, "the first snapshot's rules", func() bool {
				return c.call("basic", 1, desc("key1", "ready")).GetStatuses()[0].GetCurrentLimit() != nil
			})
			return upstreamQuotad{addr: addr,
				addReload:    func(t *testing.T) { m.set("2", append(upstreamXDSRules(), upstreamXDSReload())...) },
				removeReload: func(t *testing.T) { m.set("3", upstreamXDSRules()...) },
			}
		},
	}
}

// upstreamXDSRules are upstream's integration rules (basic.yaml and
// another.yaml) as xDS resources, as its xDS integration test writes them.
func upstreamXDSRules() []*rlsconfv3.RateLimitConfig {
	rule := func(key string, unit rlsconfv3.RateLimitUnit, perUnit uint32) *rlsconfv3.RateLimitDescriptor {
		return &rlsconfv3.RateLimitDescriptor{Key: key, RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: perUnit}}
	}
	return []*rlsconfv3.RateLimitConfig{
		{Name: "basic", Domain: "basic", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			rule("key1", rlsconfv3.RateLimitUnit_SECOND, 50), rule("key1_local", rlsconfv3.RateLimitUnit_SECOND, 50),
			rule("one_per_minute", rlsconfv3.RateLimitUnit_MINUTE, 1)}},
		{Name: "another", Domain: "another", Descriptors: []*rlsconfv3.RateLimitDescriptor{
			rule("key2", rlsconfv3.RateLimitUnit_MINUTE, 20), rule("key3", rlsconfv3.RateLimitUnit_HOUR, 10),
			rule("key2_local", rlsconfv3.RateLimitUnit_MINUTE, 20), rule("key3_local", rlsconfv3.RateLimitUnit_HOUR, 10),
			rule("key4", rlsconfv3.RateLimitUnit_DAY, 20), rule("key4_local", rlsconfv3.RateLimitUnit_DAY, 20)}},
	}
}

// upstreamXDSReload is reload.yaml as an xDS resource.
func upstreamXDSReload() *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "reload", Domain: "reload", Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "key1", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 50}},
		{Key: "block", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 0}},
		{Key: "one_per_minute", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 1}},
	}}
}

// testBasicBaseConfig's sequence: an unknown domain, one hit of a
// 50-a-second limit, 25 hits of a 20-a-minute one (the last five over),
// 15 requests of two descriptors whose hour limit of 10 runs out while the
// minute limit keeps counting, and a reset that counts down.
func TestUpstreamBasicSequence(t *testing.T) {
	for name, start := range upstreamModes() {
		t.Run(name, func(t *testing.T) {
			c := dial(t, start(t).addr)
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
// bare OK; once upstream's reload.yaml is copied into the directory (or
// the management server sends it) its limit applies; once removed, the
// domain is gone again.
func TestUpstreamConfigReload(t *testing.T) {
	for name, start := range upstreamModes() {
		t.Run(name, func(t *testing.T) {
			q := start(t)
			c := dial(t, q.addr)
			c.want("before the reload", c.call("reload", 1, desc("block", "foo")).GetStatuses()[0], ok, limit{}, 0)

			q.addReload(t)
			eventually(t, 10*time.Second, "reload.yaml's rules", func() bool {
				return c.call("reload", 1, desc("key1", "probe")).GetStatuses()[0].GetCurrentLimit() != nil
			})
			res := c.call("reload", 1, desc("key1", "foo"))
			c.want("key1 after the reload", res.GetStatuses()[0], ok, limit{50, rlsv3.RateLimitResponse_RateLimit_SECOND, ""}, 49)

			q.removeReload(t)
			eventually(t, 10*time.Second, "reload.yaml's rules gone", func() bool {
				return c.call("reload", 1, desc("key1", "probe")).GetStatuses()[0].GetCurrentLimit() == nil
			})
		})
	}
}
