package deploy_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/internal/redistest"
)

// composeRedis is what compose.yaml says about Redis.
type composeRedis struct {
	Services struct {
		Redis struct {
			Command []string
			Volumes []string
		}
	}
	Volumes map[string]any
}

// readRedisConf returns the directives of redis.conf: the first word of
// each line that is not a comment, and the rest.
func readRedisConf(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open("redis.conf")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conf := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, _ := strings.Cut(line, " ")
		conf[name] = strings.TrimSpace(value)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return conf
}

// The Redis of the deployments keeps its counters across
// a crash. redis.conf turns on the append-only file fsynced every second
// (at most about a second of writes lost) and never evicts counters;
// compose runs Redis on that file with its data on a named volume.
func TestRedisPersistsCounters(t *testing.T) {
	conf := readRedisConf(t)
	for name, want := range map[string]string{"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"} {
		if conf[name] != want {
			t.Errorf("redis.conf: %s %q, want %q", name, conf[name], want)
		}
	}

	c := readYAML[composeRedis](t, "compose.yaml")[0]
	r := c.Services.Redis
	if len(r.Command) != 2 || r.Command[0] != "redis-server" {
		t.Fatalf("compose runs redis as %q, want redis-server and its config file", r.Command)
	}
	if !slices.Contains(r.Volumes, "./redis.conf:"+r.Command[1]+":ro") {
		t.Errorf("compose's redis reads %s but mounts %v, not ./redis.conf there", r.Command[1], r.Volumes)
	}
	data := slices.IndexFunc(r.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/data") })
	if data < 0 {
		t.Fatalf("compose's redis keeps /data on no volume: %v", r.Volumes)
	}
	if name, _, _ := strings.Cut(r.Volumes[data], ":"); !hasKey(c.Volumes, name) {
		t.Errorf("compose's redis keeps /data on %q, not a named volume (volumes: %v)", name, c.Volumes)
	}

	// The file is what a real redis-server runs with: started on it, the
	// server reports AOF on with fsync every second.
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs("redis.conf")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(redistest.Binary(t), abs, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--daemonize", "no", "--protected-mode", "no")
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(ctx).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis-server on redis.conf did not answer PING within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for name, want := range map[string]string{"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"} {
		got, err := rdb.ConfigGet(ctx, name).Result()
		if err != nil || got[name] != want {
			t.Errorf("CONFIG GET %s = %v, %v; want %q", name, got, err, want)
		}
	}
	info, err := rdb.Info(ctx, "persistence").Result()
	if err != nil || !strings.Contains(info, "aof_enabled:1") {
		t.Errorf("INFO persistence without aof_enabled:1 (%v):\n%s", err, info)
	}
}

func hasKey(m map[string]any, k string) bool {
	_, ok := m[k]
	return ok
}
