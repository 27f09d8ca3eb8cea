package main

import (
	"bytes"
	"encoding/base64"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/node/store/redis"
)

func TestClusterSettings(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	keyPath := writeFile(t, "gossip.key", base64.StdEncoding.EncodeToString(key)+"\n")
	path := writeFile(t, "q.yaml", `
redis: {url: "redis://127.0.0.1:6399/0"}
cluster:
  addr: "10.0.0.1:7946"
  advertise: "192.0.2.1:7946"
  join: ["quotad-headless:7946", "10.0.0.2:7946"]
  node_name: from-file
  key_file: `+keyPath+`
  dead_after: 2s
  rejoin_interval: 30s
`)
	env := map[string]string{"QUOTAD_NODE_NAME": "from-env"}
	c, err := loadConfig([]string{"--config", path, "--cluster-addr", ":7000"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := clusterConfig{
		Addr: ":7000", Advertise: "192.0.2.1:7946", Join: []string{"quotad-headless:7946", "10.0.0.2:7946"},
		NodeName: "from-env", KeyFile: keyPath, DeadAfter: 2 * time.Second, RejoinInterval: 30 * time.Second,
	}
	if c.Cluster.Addr != want.Addr || c.Cluster.Advertise != want.Advertise || !slices.Equal(c.Cluster.Join, want.Join) ||
		c.Cluster.NodeName != want.NodeName || c.Cluster.KeyFile != want.KeyFile || c.Cluster.DeadAfter != want.DeadAfter || c.Cluster.RejoinInterval != want.RejoinInterval {
		t.Fatalf("cluster config %+v; want %+v", c.Cluster, want)
	}
	mc, err := c.Cluster.membershipConfig()
	if err != nil || !bytes.Equal(mc.SecretKey, key) || mc.BindAddr != ":7000" || mc.DeadAfter != 2*time.Second {
		t.Fatalf("membership config %+v, %v", mc, err)
	}

	// --join takes a comma-separated list, and so may the file; an empty
	// item is an error, not silently dropped (a typo would lose a seed).
	c, err = loadConfig([]string{"--redis", "redis://127.0.0.1:6399/0", "--cluster-addr", ":7946", "--cluster-insecure", "--join", "a:1, b:2,c:3"}, func(string) string { return "" }, io.Discard)
	if err != nil || !slices.Equal(c.Cluster.Join, []string{"a:1", "b:2", "c:3"}) {
		t.Fatalf("--join: %q, %v", c.Cluster.Join, err)
	}
	if _, err := loadConfig([]string{"--redis", "redis://127.0.0.1:6399/0", "--cluster-addr", ":7946", "--join", "a:1,,c:3"}, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "--join") || !strings.Contains(err.Error(), "empty address") {
		t.Fatalf("--join with an empty item: %v", err)
	}
	path = writeFile(t, "q3.yaml", "redis:\n  cluster: \"a:1,b:2\"\n")
	if c, err = loadConfig([]string{"--config", path}, func(string) string { return "" }, io.Discard); err != nil || !slices.Equal(c.Redis.ClusterAddrs, []string{"a:1", "b:2"}) {
		t.Fatalf("redis.cluster as one string in the file: %q, %v", c.Redis.ClusterAddrs, err)
	}
	path = writeFile(t, "q2.yaml", "redis: {url: \"redis://127.0.0.1:6399/0\"}\ncluster: {addr: \":7946\", join: \"a:1,b:2\", insecure: true}\n")
	c, err = loadConfig([]string{"--config", path}, func(string) string { return "" }, io.Discard)
	if err != nil || !slices.Equal(c.Cluster.Join, []string{"a:1", "b:2"}) || !c.Cluster.Insecure {
		t.Fatalf("join as one string in the file, insecure: %+v, %v", c.Cluster, err)
	}
	c, err = loadConfig([]string{"--redis", "redis://127.0.0.1:6399/0", "--cluster-addr", ":7946"}, func(k string) string {
		return map[string]string{"QUOTAD_CLUSTER_INSECURE": "true"}[k]
	}, io.Discard)
	if err != nil || !c.Cluster.Insecure {
		t.Fatalf("QUOTAD_CLUSTER_INSECURE=true: %+v, %v", c.Cluster, err)
	}
}

// The key file holds base64 of 16, 24 or 32 bytes, or those bytes raw.
func TestClusterKeyFormats(t *testing.T) {
	for _, n := range []int{16, 24, 32} {
		key := bytes.Repeat([]byte{0xa5}, n)
		for name, content := range map[string][]byte{
			"base64":         []byte(base64.StdEncoding.EncodeToString(key)),
			"base64 newline": []byte("  " + base64.StdEncoding.EncodeToString(key) + "\n"),
			"raw":            key,
		} {
			got, err := readClusterKey(writeFile(t, "k", string(content)))
			if err != nil || !bytes.Equal(got, key) {
				t.Errorf("%d-byte key as %s: %x, %v", n, name, got, err)
			}
		}
	}
	for name, content := range map[string]string{
		"empty":        "",
		"short raw":    "0123456789",
		"short base64": base64.StdEncoding.EncodeToString([]byte("01234")),
		"not base64":   strings.Repeat("!", 20),
	} {
		if _, err := readClusterKey(writeFile(t, "k", content)); err == nil || !strings.Contains(err.Error(), "openssl rand -base64 32") {
			t.Errorf("%s key file: %v; want an error saying how to make a key", name, err)
		}
	}
}

func TestClusterConfigErrors(t *testing.T) {
	redis := []string{"--redis", "redis://127.0.0.1:6399/0"}
	keyPath := writeFile(t, "gossip.key", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
	cases := []struct {
		name string
		args []string
		file string
		want []string
	}{
		{name: "cluster on the memory store", args: []string{"--cluster-addr", ":7946"}, want: []string{"config: cluster: --cluster-addr needs Redis (--redis, --redis-cluster or --redis-sentinel) or memcached (--memcache): on the embedded memory store every node keeps its own counters, so a cluster would admit each limit once per node; configure one store that every node shares"}}, // quoted in docs/cluster.md
		{name: "join without an address", args: append(redis, "--join", "a:7946"), want: []string{"need --cluster-addr"}},
		{name: "key file without an address", args: append(redis, "--cluster-key-file", "/k"), want: []string{"need --cluster-addr"}},
		{name: "insecure without an address", args: append(redis, "--cluster-insecure"), want: []string{"config: cluster: --join, --cluster-advertise, --node-name, --cluster-key-file, --cluster-insecure, --cluster-api-port and the timings need --cluster-addr, the gossip address"}}, // quoted in docs/errors.md
		{name: "api port without an address", args: append(redis, "--cluster-api-port", "8080"), want: []string{"need --cluster-addr"}},
		{name: "api port out of range", args: append(redis, "--cluster-addr", ":7946", "--cluster-insecure", "--cluster-api-port", "70000"), want: []string{"config: cluster: --cluster-api-port 70000: want the members' API port, 1 to 65535, or 0 for the port of --listen"}}, // quoted in docs/errors.md
		{name: "no key", args: append(redis, "--cluster-addr", ":7946"), want: []string{"config: cluster: --cluster-addr needs --cluster-key-file", "openssl rand -base64 32", "forge", "--cluster-insecure"}},
		{name: "no key in the file", file: "redis: {url: \"redis://127.0.0.1:6399/0\"}\ncluster: {addr: \":7946\"}\n", want: []string{"--cluster-addr needs --cluster-key-file"}},
		{name: "insecure and a key", args: append(redis, "--cluster-addr", ":7946", "--cluster-key-file", keyPath, "--cluster-insecure"), want: []string{"--cluster-insecure and --cluster-key-file contradict each other"}},
		{name: "bind to a name", args: append(redis, "--cluster-addr", "localhost:7946"), want: []string{"cluster bind address", "not an IP"}},
		{name: "bad seed", args: append(redis, "--cluster-addr", ":7946", "--join", "a:b:c"), want: []string{"join[0]"}},
		{name: "missing key file", args: append(redis, "--cluster-addr", ":7946", "--cluster-key-file", "/nonexistent/key"), want: []string{"cluster key file", "/nonexistent/key"}},
		{name: "dead after too short", args: append(redis, "--cluster-addr", ":7946", "--cluster-dead-after", "1ms"), want: []string{"cluster dead after", "100ms"}},
		{name: "bad dead after", args: append(redis, "--cluster-dead-after", "soon"), want: []string{"--cluster-dead-after", "soon"}},
		{name: "join as a mapping", file: "cluster:\n  addr: \":7946\"\n  join: {a: 1}\n", want: []string{"q.yaml", "line 3", "join"}},
		{name: "unknown cluster field", file: "cluster:\n  addr: \":7946\"\n  seeds: [a]\n", want: []string{"q.yaml", "line 3", "seeds"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, "q.yaml", tc.file)}, args...)
			}
			_, err := loadConfig(args, func(string) string { return "" }, io.Discard)
			if err == nil {
				t.Fatal("loadConfig accepted a bad cluster configuration")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// Nodes compare their Redis by these names: equal for the spellings of one
// server, different for another server or database, never a credential.
func TestRedisIdentity(t *testing.T) {
	same := []redis.Config{
		{URL: "redis://Redis.Example:6379/0"},
		{URL: "redis://redis.example/0"},
		{URL: "redis://user:s3cret@redis.example:6379"},
		{URL: "rediss://redis.example:6379/"},
	}
	want := "redis redis.example:6379 db 0"
	for _, r := range same {
		if got := redisIdentity(r); got != want {
			t.Errorf("%s: %q; want %q", r.URL, got, want)
		}
	}
	distinct := map[string]redis.Config{
		"another db":     {URL: "redis://redis.example:6379/1"},
		"another port":   {URL: "redis://redis.example:6380/0"},
		"another host":   {URL: "redis://10.0.0.5:6379/0"},
		"cluster":        {ClusterAddrs: []string{"b:7001", "A:7000", "b:7001"}},
		"sentinel":       {SentinelAddrs: []string{"s:26379"}, MasterName: "main"},
		"sentinel db 2":  {SentinelAddrs: []string{"s:26379"}, MasterName: "main", DB: 2},
		"other sentinel": {SentinelAddrs: []string{"s:26379"}, MasterName: "other"},
	}
	seen := map[string]string{want: "the first"}
	for name, r := range distinct {
		id := redisIdentity(r)
		if other, dup := seen[id]; dup {
			t.Errorf("%s and %s both name %q", name, other, id)
		}
		seen[id] = name
		if strings.Contains(id, "s3cret") {
			t.Errorf("%s: %q holds a credential", name, id)
		}
	}
	if got := redisIdentity(redis.Config{ClusterAddrs: []string{"b:7001", "a:7000"}}); got != redisIdentity(distinct["cluster"]) || got != "redis cluster a:7000,b:7001" {
		t.Errorf("cluster seeds in another order: %q", got)
	}
	if got := redisIdentity(redis.Config{SentinelAddrs: []string{"t:26379"}, MasterName: "main"}); got != redisIdentity(distinct["sentinel"]) {
		t.Errorf("the same master through other sentinels: %q", got)
	}
}
