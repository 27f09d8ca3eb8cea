package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/envoy"
)

// Every mistake is refused naming the file, the line and the path; keys
// quotad does not support are refused by name, not ignored.
func TestEnvoyFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"empty file", "", []string{"e.yaml: empty"}},
		{"not YAML", "domain: [x\n", []string{"e.yaml", "line"}},
		{"not a mapping", "- a\n", []string{"e.yaml: line 1", "want a mapping with the keys domain, descriptors"}},
		{"two documents", "domain: a\n---\ndomain: b\n", []string{"e.yaml: line 2", "a second YAML document"}},
		{"unknown top-level key", "domain: a\ndescriptor: []\n", []string{"e.yaml: line 2: descriptor", `unknown key "descriptor"`, "domain, descriptors"}},
		{"unknown descriptor key", "domain: a\ndescriptors:\n  - key: k\n    rate_limt: {unit: second}\n",
			[]string{"e.yaml: line 4: descriptors[0].rate_limt", `unknown key "rate_limt"`}},
		{"unknown rate_limit key", "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        rate_limit:\n          unit: second\n          request_per_unit: 3\n",
			[]string{"e.yaml: line 8: descriptors[0].descriptors[0].rate_limit.request_per_unit", `unknown key "request_per_unit"`, "requests_per_unit"}},
		{"unit_multiplier", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 30}\n",
			[]string{"line 4: descriptors[0].rate_limit.unit_multiplier", `unknown key "unit_multiplier"`}},
		{"share_threshold without a wildcard", "domain: a\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"e.yaml: line 3: descriptors[0].share_threshold", "share_threshold takes a wildcard value"}},
		{"metadata not a mapping", "domain: a\ndescriptors:\n  - key: k\n    metadata: [1]\n",
			[]string{"e.yaml: line 4: descriptors[0].metadata", "want a mapping"}},
		{"key twice", "domain: a\ndescriptors:\n  - key: k\n    key: j\n", []string{"line 4: descriptors[0].key: written twice"}},
		{"negative requests_per_unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			[]string{"line 4: descriptors[0].rate_limit.requests_per_unit", `want a whole number from 0 to 4294967295, got "-1"`}},
		{"huge requests_per_unit", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
			[]string{"requests_per_unit", "4294967296"}},
		{"boolean", "domain: a\ndescriptors:\n  - key: k\n    shadow_mode: sometimes\n", []string{"line 4: descriptors[0].shadow_mode", `want true or false, got "sometimes"`}},
		{"descriptors not a list", "domain: a\ndescriptors: k\n", []string{"line 2: descriptors: want a list of descriptors"}},
		{"replaces not a list", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, replaces: x}\n", []string{"descriptors[0].rate_limit.replaces: want a list"}},
		{"key not a string", "domain: a\ndescriptors:\n  - key: [k]\n", []string{"line 3: descriptors[0].key: want a string"}},
		// What the rules mean is rpc's to judge, with the same naming.
		{"bad unit", "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        rate_limit: {unit: dya, requests_per_unit: 1}\n",
			[]string{"envoy config dir", "e.yaml: line 5: descriptors[0].descriptors[0].rate_limit.unit", `"dya" is not a unit`}},
		{"no domain", "descriptors: []\n", []string{"e.yaml: domain", "must not be empty"}},
		{"unknown quotad_policy", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {quotad_policy: per-ipp}\n",
			[]string{"e.yaml: line 3: descriptors[0].rate_limit.quotad_policy", `unknown policy "per-ipp"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config{EnvoyDir: "/rules", Policies: envoyTestPolicies(t)}
			_, err := c.envoyRules([]envoyFile{{name: "e.yaml", raw: []byte(tc.file)}})
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// envoyTestPolicies are envoyPolicies, configured.
func envoyTestPolicies(t *testing.T) []node.Policy {
	t.Helper()
	c, err := loadConfig([]string{"--config", writeFile(t, "p.yaml", envoyPolicies)}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return c.Policies
}

// A directory's config files: *.yaml and *.yml, symbolic links followed,
// sorted; hidden names (Kubernetes' ..data), other files and subdirectories
// left alone. A domain in two files, or in the config file and a file, is
// refused naming both.
func TestReadEnvoyFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("b.yml", "domain: b\n")
	write("a.yaml", "domain: a\n")
	write("README.md", "not a config file")
	write(".hidden.yaml", "domain: hidden\n")
	write("..2024_01_01/c.yaml", "domain: c\n")
	write("sub/d.yaml", "domain: d\n")
	if err := os.Symlink("..2024_01_01", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "c.yaml"), filepath.Join(dir, "c.yaml")); err != nil {
		t.Fatal(err)
	}
	files, err := readEnvoyFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.name)
	}
	if !slices.Equal(names, []string{"a.yaml", "b.yml", "c.yaml"}) {
		t.Fatalf("read %v, want a.yaml, b.yml, c.yaml", names)
	}
	c := config{EnvoyDir: dir}
	rules, err := c.envoyRules(files)
	if err != nil {
		t.Fatal(err)
	}
	if d := rules.Domains(); !slices.Equal(d, []string{"a", "b", "c"}) {
		t.Errorf("domains %v", d)
	}

	write("e.yaml", "domain: b\n")
	files, _ = readEnvoyFiles(dir)
	if _, err := c.envoyRules(files); err == nil || !strings.Contains(err.Error(), `e.yaml: domain: invalid envoy config: "b" is configured twice (also in b.yml)`) {
		t.Errorf("a domain in two files: %v", err)
	}
	c.Envoy.Domains = []envoy.Domain{{Domain: "a", Descriptors: []envoy.Descriptor{{Key: "k", Unlimited: true}}}}
	files = files[:1]
	if _, err := c.envoyRules(files); err == nil || !strings.Contains(err.Error(), `a.yaml: domain: invalid envoy config: "a" is configured twice (also in envoy.domains[0] of the config file)`) {
		t.Errorf("a domain in the config file and a file: %v", err)
	}

	if _, _, err := loadEnvoy(config{EnvoyDir: filepath.Join(dir, "nope")}); err == nil || !strings.Contains(err.Error(), "envoy config dir: open") {
		t.Errorf("a missing directory: %v", err)
	}
}

// The settings reach the config from the file, the environment and flags.
func TestEnvoySettings(t *testing.T) {
	path := writeFile(t, "q.yaml", "envoy:\n  config_dir: /from/file\n  shadow_mode: true\n  near_limit_ratio: 0.5\n")
	c, err := loadConfig([]string{"--config", path}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.EnvoyDir != "/from/file" || !c.Envoy.ShadowMode || c.Envoy.NearLimitRatio != 0.5 {
		t.Errorf("from the file: dir %q, shadow %t, ratio %g", c.EnvoyDir, c.Envoy.ShadowMode, c.Envoy.NearLimitRatio)
	}
	env := map[string]string{"QUOTAD_ENVOY_CONFIG_DIR": "/from/env", "QUOTAD_ENVOY_NEAR_LIMIT_RATIO": "0.9"}
	c, err = loadConfig([]string{"--config", path, "--envoy-shadow-mode=false"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.EnvoyDir != "/from/env" || c.Envoy.ShadowMode || c.Envoy.NearLimitRatio != 0.9 {
		t.Errorf("from env and flags: dir %q, shadow %t, ratio %g", c.EnvoyDir, c.Envoy.ShadowMode, c.Envoy.NearLimitRatio)
	}
	for _, args := range [][]string{{"--envoy-near-limit-ratio", "1.5"}, {"--envoy-near-limit-ratio", "lots"}} {
		if _, err := loadConfig(args, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "near") {
			t.Errorf("%v: %v, want an error about the ratio", args, err)
		}
	}
}

// syncLog collects log lines for tests that wait on them.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The reloader follows the envoy config dir as it follows the config file,
// in one goroutine: a changed limit, a new file, a broken file (the rules
// in force stay, the error is logged once), its repair and a removal. A
// policy the config file changes reaches the directory's rules that name
// it (they are compiled anew with the new policies, never with those of
// the start), and the generation and hash follow every change applied.
func TestReloaderFollowsEnvoyDir(t *testing.T) {
	dir, cfgDir := t.TempDir(), t.TempDir()
	write := func(dir, name, content string) {
		t.Helper()
		// Through a rename, as editors and Kubernetes do: never half a file.
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	policy := func(limit int) string {
		return fmt.Sprintf("policies:\n  - name: p\n    algorithm: fixed_window\n    limit: %d\n    period: 1m\n", limit)
	}
	write(cfgDir, "q.yaml", policy(5))
	write(dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: one}\n")
	write(dir, "p.yaml", "domain: p\ndescriptors:\n  - key: k\n    rate_limit: {quotad_policy: p}\n")
	args := []string{"--config", filepath.Join(cfgDir, "q.yaml"), "--envoy-config-dir", dir}
	getenv := func(string) string { return "" }
	cfg, err := loadConfig(args, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sw, files, err := loadEnvoy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(cfg.nodeConfig(), memory.New(nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	var logs syncLog
	r, err := newReloader(cfg, files, args, getenv, slog.New(slog.NewTextHandler(&logs, nil)), new(slog.LevelVar), nil)
	if err != nil {
		t.Fatal(err)
	}
	r.every = 10 * time.Millisecond
	rpcCfg := cfg.rpcConfig()
	rpcCfg.Envoy = sw
	rpcCfg.ConfigVersion = r.configVersion()
	h, err := rpc.NewHandler(n, rpcCfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	rls := ratelimitv3connect.NewRateLimitServiceClient(srv.Client(), srv.URL)
	limitOf := func(domain string) uint32 {
		t.Helper()
		res, err := rls.ShouldRateLimit(context.Background(), connect.NewRequest(&rlsv3.RateLimitRequest{Domain: domain,
			Descriptors: []*rlscommonv3.RateLimitDescriptor{{Entries: []*rlscommonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	stop := r.start(context.Background(), n, h)
	defer stop()
	first, v1 := sw.Rules(), r.configVersion()
	if v1.Generation != 1 || v1.Hash == "" {
		t.Fatalf("version at start: %+v", v1)
	}
	if got := limitOf("p"); got != 5 {
		t.Fatalf("domain p: limit %d, want policy p's 5", got)
	}

	write(dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2, name: two}\n")
	waitFor(t, 10*time.Second, func() bool { return sw.Rules() != first })
	if got := limitOf("a"); got != 2 {
		t.Fatalf("domain a after the change: limit %d, want 2", got)
	}
	if v := r.configVersion(); v.Generation != 2 || v.Hash == v1.Hash {
		t.Fatalf("version after a directory change: %+v, want generation 2 and a new hash (was %+v)", v, v1)
	}
	write(dir, "b.yaml", "domain: b\n")
	waitFor(t, 10*time.Second, func() bool { return slices.Equal(sw.Rules().Domains(), []string{"a", "b", "p"}) })

	// The config file's policy changes; the directory's rule naming it
	// follows.
	write(cfgDir, "q.yaml", policy(9))
	waitFor(t, 10*time.Second, func() bool { return limitOf("p") == 9 })
	if gen, _ := r.configGeneration(); gen != 4 {
		t.Errorf("generation %d after three changes, want 4", gen)
	}

	good := sw.Rules()
	write(dir, "b.yaml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	waitFor(t, 10*time.Second, func() bool { return strings.Contains(logs.String(), "config reload failed") })
	if sw.Rules() != good {
		t.Fatal("a broken file replaced the rules in force")
	}
	if !strings.Contains(logs.String(), `b.yaml: line 3: descriptors[0].rate_limit.unit`) {
		t.Errorf("the log does not name the file, line and path:\n%s", logs.String())
	}
	write(dir, "b.yaml", "domain: b2\n")
	waitFor(t, 10*time.Second, func() bool { return slices.Equal(sw.Rules().Domains(), []string{"a", "b2", "p"}) })
	if n := strings.Count(logs.String(), "config reload failed"); n != 1 {
		t.Errorf("the error was logged %d times, want once:\n%s", n, logs.String())
	}
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return slices.Equal(sw.Rules().Domains(), []string{"b2", "p"}) })
	if got := limitOf("a"); got != 0 {
		t.Errorf("removed domain a: limit %d, want none (drop-in: unknown domains are OK)", got)
	}
}

// A directory is bounded as a whole: its config files may hold 4 MiB and
// 400,000 YAML nodes in all, each file within the bounds of one.
func TestEnvoyDirBounds(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"a", "b", "c", "d", "e"} {
		writeRenamed(t, dir, d+".yaml", bigEnvoyFile(d, 8200, 1)) // 90,203 nodes, 770 KB
	}
	files, err := readEnvoyFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := "envoy config dir " + dir + ": e.yaml: the directory's config files hold more than 400000 YAML nodes (with aliases expanded) in all, the most quotad reads of one directory"
	if _, err := (config{EnvoyDir: dir}).envoyRules(files); err == nil || err.Error() != want {
		t.Errorf("%v, want %q", err, want)
	}
	if _, err := (config{EnvoyDir: dir}).envoyRules(files[:4]); err != nil {
		t.Errorf("four of the files: %v", err)
	}

	writeRenamed(t, dir, "f.yaml", "# "+strings.Repeat("x", 900_000)+"\ndomain: f\n")
	want = dir + ": its config files hold more than 4194304 bytes (4 MiB) in all, the most quotad reads of one directory"
	if _, err := readEnvoyFiles(dir); err == nil || err.Error() != want {
		t.Errorf("%v, want %q", err, want)
	}
}
