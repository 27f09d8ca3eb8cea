package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/internal/quotadtest"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
)

// Attacks on quotad's config inputs, each against a built binary: named
// pipes where config files belong.

// watched is a quotad process a test follows from its start, whether it
// comes to listen or is refused.
type watched struct {
	cmd            *exec.Cmd
	stdout, stderr *lockedBuffer
	exited         chan struct{} // closed once the process has been waited for
	err            error         // Wait's result, once exited is closed
}

// watchQuotad starts the quotad binary with args on a free loopback port.
// It is killed when the test ends if it still runs.
func watchQuotad(t *testing.T, args ...string) *watched {
	t.Helper()
	w := &watched{
		cmd:    exec.Command(quotadtest.Binary(t), append([]string{"--listen", "127.0.0.1:0"}, args...)...),
		stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, exited: make(chan struct{}),
	}
	w.cmd.Stdout, w.cmd.Stderr = w.stdout, w.stderr
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		w.err = w.cmd.Wait()
		close(w.exited)
	}()
	t.Cleanup(func() {
		_ = w.cmd.Process.Kill()
		<-w.exited
	})
	return w
}

func (l *lockedBuffer) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// until waits within the time given for cond, for the process to exit
// (exited), or for its resident memory to pass rssCap bytes (0: no cap),
// whichever comes first. Past the time or the cap, it kills the process
// and fails the test, saying what happened.
func (w *watched) until(t *testing.T, within time.Duration, rssCap int64, cond func() bool) {
	t.Helper()
	start := time.Now()
	for {
		select {
		case <-w.exited:
			return
		default:
		}
		if cond() {
			return
		}
		if rss, _, err := quotadtest.ProcMemory(w.cmd.Process.Pid); err == nil && rssCap > 0 && rss > rssCap {
			_ = w.cmd.Process.Kill()
			t.Fatalf("quotad's resident memory reached %d MiB after %s, over the %d MiB allowed; killed it. stderr:\n%s",
				rss>>20, time.Since(start).Round(time.Millisecond), rssCap>>20, w.stderr.tail())
		}
		if time.Since(start) > within {
			_ = w.cmd.Process.Kill()
			t.Fatalf("still waiting after %s; killed quotad. stdout:\n%s\nstderr:\n%s", within, w.stdout.tail(), w.stderr.tail())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitExit waits for the process to exit (see until), and returns how
// long that took.
func (w *watched) waitExit(t *testing.T, within time.Duration, rssCap int64) time.Duration {
	t.Helper()
	start := time.Now()
	w.until(t, within, rssCap, func() bool { return false })
	return time.Since(start)
}

// url waits until quotad says where it listens, and returns that.
func (w *watched) url(t *testing.T) string {
	t.Helper()
	const marker = "quotad listening on "
	w.until(t, time.Minute, 0, func() bool { return w.stdout.contains(marker) })
	out := w.stdout.text()
	i := strings.Index(out, marker)
	if i < 0 {
		t.Fatalf("quotad exited before it listened: %v\n%s", w.err, w.stderr.tail())
	}
	return strings.Fields(out[i+len(marker):])[0]
}

// lastLine is the last line the process wrote on stderr.
func (w *watched) lastLine() string {
	lines := strings.Split(strings.TrimSpace(w.stderr.text()), "\n")
	return lines[len(lines)-1]
}

// writeRenamed writes content to dir/name through a rename, as editors
// and Kubernetes do: quotad never reads half a file.
func writeRenamed(t *testing.T, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, ".tmp-"+name)
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// mkfifo makes a named pipe at path that no one writes.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// rlsLimit asks quotad at url for the limit of descriptor k=v in domain.
func rlsLimit(t *testing.T, url, domain string) uint32 {
	t.Helper()
	rls := ratelimitv3connect.NewRateLimitServiceClient(&http.Client{Timeout: 10 * time.Second}, url)
	res, err := rls.ShouldRateLimit(t.Context(), connect.NewRequest(&rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*rlscommonv3.RateLimitDescriptor{{Entries: []*rlscommonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// sigterm sends SIGTERM and waits for the process to exit 0, for at most
// shutdownWithin; it returns how long the exit took.
func (w *watched) sigterm(t *testing.T) time.Duration {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	took := w.waitExit(t, shutdownWithin, 0)
	if w.err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0\n%s", w.err, w.stderr.tail())
	}
	return took
}

// shutdownWithin is how long quotad may take to exit after SIGTERM with
// nothing in flight: its --shutdown-timeout, 10s, would be a drain that
// waited for its deadline.
const shutdownWithin = 10 * time.Second

// A named pipe at --config: refused at start, exit 1 at once; swapped in
// for the file while quotad serves, the reload is refused, the node keeps
// its configuration and readiness, and SIGTERM exits 0 at once.
func TestNamedPipeAtConfigIsRefused(t *testing.T) {
	t.Run("at start", func(t *testing.T) {
		fifo := filepath.Join(t.TempDir(), "q.yaml")
		mkfifo(t, fifo)
		p := watchQuotad(t, "--config", fifo)
		took := p.waitExit(t, 10*time.Second, 0)
		want := fmt.Sprintf("quotad: config: %s is a named pipe, not a regular file", fifo)
		if p.err == nil || p.lastLine() != want {
			t.Errorf("exit %v, last line %q; want exit 1 and %q", p.err, p.lastLine(), want)
		}
		t.Logf("refused in %s: %s", took.Round(time.Millisecond), p.lastLine())
	})
	t.Run("on reload", func(t *testing.T) {
		d := newConfigMapDir(t, reloadConfig(100, 10))
		p := watchQuotad(t, "--config", d.path())
		url := p.url(t)
		v1 := getConfigVersion(t, url)

		// The next version's quotad.yaml is a named pipe.
		d.version++
		ts := fmt.Sprintf("..fifo_%d", d.version)
		if err := os.Mkdir(filepath.Join(d.dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		mkfifo(t, filepath.Join(d.dir, ts, "quotad.yaml"))
		if err := os.Symlink(ts, filepath.Join(d.dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := os.Rename(filepath.Join(d.dir, "..data_tmp"), filepath.Join(d.dir, "..data")); err != nil {
			t.Fatal(err)
		}
		p.until(t, 20*time.Second, 0, func() bool { return p.stderr.contains("config reload failed") })
		refused := time.Since(start)
		if want := fmt.Sprintf("config: %s is a named pipe, not a regular file", d.path()); !p.stderr.contains(want) {
			t.Errorf("the log lacks %q:\n%s", want, p.stderr.tail())
		}
		if v := getConfigVersion(t, url); v.Config.Generation != v1.Config.Generation || v.Config.Hash != v1.Config.Hash {
			t.Errorf("config after the refused reload %+v, want %+v", v.Config, v1.Config)
		}
		if res, err := http.Get(url + "/readyz"); err != nil || res.StatusCode != http.StatusOK {
			t.Errorf("/readyz: %v %v", res, err)
		} else {
			res.Body.Close()
		}
		took := p.sigterm(t)
		t.Logf("reload refused %s after the swap; exit %s after SIGTERM", refused.Round(time.Millisecond), took.Round(time.Millisecond))
	})
}

// A named pipe among --envoy-config-dir's files: refused at start, exit 1
// at once; added while quotad serves, the reload is refused, the rules in
// force stay, and SIGTERM exits 0 at once.
func TestNamedPipeInEnvoyConfigDirIsRefused(t *testing.T) {
	t.Run("at start", func(t *testing.T) {
		dir := t.TempDir()
		writeRenamed(t, dir, "a.yaml", "domain: a\n")
		mkfifo(t, filepath.Join(dir, "b.yaml"))
		p := watchQuotad(t, "--envoy-config-dir", dir)
		took := p.waitExit(t, 10*time.Second, 0)
		want := fmt.Sprintf("quotad: envoy config dir: %s is a named pipe, not a regular file", filepath.Join(dir, "b.yaml"))
		if p.err == nil || p.lastLine() != want {
			t.Errorf("exit %v, last line %q; want exit 1 and %q", p.err, p.lastLine(), want)
		}
		t.Logf("refused in %s: %s", took.Round(time.Millisecond), p.lastLine())
	})
	t.Run("on reload", func(t *testing.T) {
		dir := t.TempDir()
		writeRenamed(t, dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n")
		p := watchQuotad(t, "--envoy-config-dir", dir)
		url := p.url(t)
		start := time.Now()
		mkfifo(t, filepath.Join(dir, "b.yaml"))
		p.until(t, 20*time.Second, 0, func() bool { return p.stderr.contains("config reload failed") })
		refused := time.Since(start)
		if want := fmt.Sprintf("envoy config dir: %s is a named pipe, not a regular file", filepath.Join(dir, "b.yaml")); !p.stderr.contains(want) {
			t.Errorf("the log lacks %q:\n%s", want, p.stderr.tail())
		}
		if got := rlsLimit(t, url, "a"); got != 7 {
			t.Errorf("domain a after the refused reload: limit %d, want 7", got)
		}
		if v := getConfigVersion(t, url); v.Config.Generation != 1 {
			t.Errorf("generation %d after a refused reload, want 1", v.Config.Generation)
		}
		took := p.sigterm(t)
		t.Logf("reload refused %s after the pipe appeared; exit %s after SIGTERM", refused.Round(time.Millisecond), took.Round(time.Millisecond))
	})
}
