package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/quotad/quotad/internal/quotadtest"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
)

// Attacks on quotad's config inputs, each against a built binary: an
// envoyproxy/ratelimit file whose aliases expand without end, named pipes
// where config files belong, and SIGTERM while a reload loads.

// rssGrowthBound is how much a refused config may grow quotad's resident
// memory.
const rssGrowthBound = 128 << 20

// envoyAliasBomb is an envoyproxy/ratelimit file of about 80 bytes a
// level whose descriptor lists each name the previous level's list twice:
// 2^(depth+2) rules once its aliases are expanded.
func envoyAliasBomb(depth int) string {
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n  - key: l0\n    descriptors: &l0\n" +
		"      - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n" +
		"      - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for i := 1; i <= depth; i++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &l%d\n      - {key: a, descriptors: *l%d}\n      - {key: b, descriptors: *l%d}\n", i, i, i-1, i-1)
	}
	return b.String()
}

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

// memory is the process's resident memory now and its peak so far.
func (w *watched) memory(t *testing.T) (rss, peak int64) {
	t.Helper()
	rss, peak, err := quotadtest.ProcMemory(w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return rss, peak
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

// refusal is a start quotad refused: what it printed, its peak resident
// memory when it printed it, and how long after its start that was.
type refusal struct {
	exit   error
	stderr string
	peak   int64
	took   time.Duration
}

// refuseAtStart runs quotad with args, which it must refuse. Its stderr is
// a pipe the test has filled, so that quotad's first line there, the
// refusal, holds it in write(2) with all it allocated still mapped; its
// peak resident memory (VmHWM) is read from /proc then, before the pipe is
// drained and quotad exits. (A child's rusage would not do: on Linux its
// peak counts the memory of the test process it was cloned from.) Above
// rssCap bytes resident (0: no cap) quotad is killed and the test fails.
func refuseAtStart(t *testing.T, rssCap int64, args ...string) refusal {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(quotadtest.Binary(t), append([]string{"--listen", "127.0.0.1:0"}, args...)...)
	cmd.Stderr = w // exec uses w.Fd(), which makes the pipe blocking
	size, err := unix.FcntlInt(w.Fd(), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var got refusal
	for {
		if writingPipe(pid) {
			got.took = time.Since(start)
			_, got.peak, err = quotadtest.ProcMemory(pid)
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		if rss, _, err := quotadtest.ProcMemory(pid); err != nil {
			t.Fatalf("quotad exited without writing to stderr: %v", err)
		} else if rssCap > 0 && rss > rssCap {
			_ = cmd.Process.Kill()
			t.Fatalf("quotad's resident memory reached %d MiB after %s, over the %d MiB allowed; killed it",
				rss>>20, time.Since(start).Round(time.Millisecond), rssCap>>20)
		}
		if time.Since(start) > time.Minute {
			_ = cmd.Process.Kill()
			t.Fatal("quotad neither refused to start nor exited within a minute; killed it")
		}
		time.Sleep(time.Millisecond)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	got.exit = cmd.Wait()
	got.stderr = string(out[size:])
	return got
}

// writingPipe reports whether a thread of process pid waits to write to a
// full pipe.
func writingPipe(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
	for _, task := range tasks {
		if b, err := os.ReadFile(task); err == nil && strings.Contains(string(b), "pipe_write") {
			return true
		}
	}
	return false
}

// An envoyproxy/ratelimit file of 2 KB whose descriptor lists each alias
// the previous level's twice (2^22 rules expanded) is refused at start,
// naming the file, the line and the bound, without quotad's peak memory
// growing by rssGrowthBound over a refusal of a small broken file.
func TestEnvoyAliasBombIsRefusedAtStart(t *testing.T) {
	small := t.TempDir()
	writeRenamed(t, small, "a.yaml", "domain: a\ndescriptors: 3\n")
	base := refuseAtStart(t, 0, "--envoy-config-dir", small)
	if base.exit == nil || !strings.Contains(base.stderr, "want a list of descriptors") {
		t.Fatalf("the baseline: %v, %q", base.exit, base.stderr)
	}

	dir := t.TempDir()
	bomb := envoyAliasBomb(20)
	writeRenamed(t, dir, "bomb.yaml", bomb)
	p := refuseAtStart(t, base.peak+rssGrowthBound, "--envoy-config-dir", dir)
	want := fmt.Sprintf("quotad: envoy config dir %s: bomb.yaml: line ", dir)
	if p.exit == nil || !strings.HasPrefix(p.stderr, want) || !strings.Contains(p.stderr, "more than 100000 YAML nodes") || strings.Count(p.stderr, "\n") != 1 {
		t.Errorf("exit %v, stderr %q; want exit 1 and one line starting %q that names the bound", p.exit, p.stderr, want)
	}
	growth := p.peak - base.peak
	if growth > rssGrowthBound {
		t.Errorf("peak resident memory %d MiB, %d MiB over a small file's refusal", p.peak>>20, growth>>20)
	}
	t.Logf("a %d-byte file refused %s after the start; peak RSS at the refusal %.1f MiB, %.1f MiB for a small broken file: %+.1f MiB. %s",
		len(bomb), p.took.Round(time.Millisecond), float64(p.peak)/(1<<20), float64(base.peak)/(1<<20), float64(growth)/(1<<20), strings.TrimSpace(p.stderr))
}

// The same file added to --envoy-config-dir while quotad serves: the
// reload is refused and logged with the file, the line and the bound,
// quickly and without the process's peak memory growing by
// rssGrowthBound; the rules in force stay, and SIGTERM then exits 0 at
// once.
func TestEnvoyAliasBombIsRefusedOnReload(t *testing.T) {
	dir := t.TempDir()
	writeRenamed(t, dir, "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 7}\n")
	p := watchQuotad(t, "--envoy-config-dir", dir)
	url := p.url(t)
	if got := rlsLimit(t, url, "a"); got != 7 {
		t.Fatalf("domain a: limit %d, want 7", got)
	}
	_, before := p.memory(t)

	start := time.Now()
	writeRenamed(t, dir, "bomb.yaml", envoyAliasBomb(20))
	p.until(t, time.Minute, before+rssGrowthBound, func() bool { return p.stderr.contains("config reload failed") })
	refused := time.Since(start)
	rss, after := p.memory(t)
	if after-before > rssGrowthBound {
		t.Errorf("peak resident memory grew from %d to %d MiB", before>>20, after>>20)
	}
	log := p.stderr.text()
	if !strings.Contains(log, fmt.Sprintf("envoy config dir %s: bomb.yaml: line ", dir)) || !strings.Contains(log, "more than 100000 YAML nodes") {
		t.Errorf("the refusal does not name the file, its line and the bound:\n%s", log)
	}
	if v := getConfigVersion(t, url); v.Config.Generation != 1 {
		t.Errorf("generation %d after a refused reload, want 1", v.Config.Generation)
	}
	if got := rlsLimit(t, url, "a"); got != 7 {
		t.Errorf("domain a after the refused reload: limit %d, want 7", got)
	}
	took := p.sigterm(t)
	t.Logf("refused %s after the file was written (the poll runs every %s); peak RSS %.1f MiB before, %.1f MiB after (RSS now %.1f MiB); exit %s after SIGTERM",
		refused.Round(time.Millisecond), configPollInterval, float64(before)/(1<<20), float64(after)/(1<<20), float64(rss)/(1<<20), took.Round(time.Millisecond))
	for line := range strings.SplitSeq(log, "\n") {
		if strings.Contains(line, "config reload failed") {
			t.Log(line)
		}
	}
}

// bigEnvoyFile is a valid envoyproxy/ratelimit file for domain of n
// rules of limit requests per second, about 90 bytes and 11 YAML nodes
// each.
func bigEnvoyFile(domain string, n, limit int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for i := range n {
		fmt.Fprintf(&b, "  - key: key%06d\n    value: v\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n", i, limit)
	}
	return b.String()
}

// SIGTERM while a reload loads a large (valid) directory: quotad shuts
// down without waiting for the load, which is abandoned and never applied.
// (A binary built with -race exits a second late: the race detector
// sleeps that long at exit.)
func TestSIGTERMDuringASlowReloadExitsPromptly(t *testing.T) {
	// The files are symbolic links through ..data, as Kubernetes mounts a
	// ConfigMap, so that the whole directory changes in one rename.
	dir := t.TempDir()
	domains := []string{"a", "b", "c", "d"}
	swap := func(version int, content func(domain string) string) {
		t.Helper()
		ts := fmt.Sprintf("..v%d", version)
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, d := range domains {
			if err := os.WriteFile(filepath.Join(dir, ts, d+".yaml"), []byte(content(d)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	swap(1, func(d string) string { return bigEnvoyFile(d, 1, 1) })
	for _, d := range domains {
		if err := os.Symlink(filepath.Join("..data", d+".yaml"), filepath.Join(dir, d+".yaml")); err != nil {
			t.Fatal(err)
		}
	}
	p := watchQuotad(t, "--envoy-config-dir", dir)
	p.url(t)

	// About 8,000 rules and 90,000 YAML nodes a file, near the directory's
	// bounds: first applied, to learn the CPU time a reload of them takes.
	cpu0, _ := procStat(t, p.cmd.Process.Pid)
	swap(2, func(d string) string { return bigEnvoyFile(d, 8000, 10) })
	p.until(t, time.Minute, 0, func() bool { return p.stderr.contains("config reloaded") })
	cpu1, _ := procStat(t, p.cmd.Process.Pid)
	reloadCPU := cpu1 - cpu0

	// Then changed again, and SIGTERM sent once quotad, idle in between,
	// has spent a quarter of that: the load is under way (the poll that
	// sees the change reads and hashes the files in a fraction of it).
	swap(3, func(d string) string { return bigEnvoyFile(d, 8000, 20) })
	p.until(t, time.Minute, 0, func() bool {
		cpu, _ := procStat(t, p.cmd.Process.Pid)
		return cpu-cpu1 >= reloadCPU/4
	})
	if n := strings.Count(p.stderr.text(), "config reload"); n != 1 {
		t.Fatalf("the second reload ended before SIGTERM could meet it; make the files larger:\n%s", p.stderr.tail())
	}
	mark := len(p.stderr.text())
	took := p.sigterm(t)
	after := p.stderr.text()[mark:]
	if strings.Contains(after, "config reloaded") {
		t.Errorf("shutdown waited for the reload to finish and apply (exit %s after SIGTERM):\n%s", took.Round(time.Millisecond), after)
	}
	if !strings.Contains(after, `msg="config reload abandoned: shutting down" trigger="file changed"`) {
		t.Errorf("SIGTERM did not meet a reload in progress:\n%s", after)
	}
	t.Logf("a reload of %d files of 8,000 rules takes %s of CPU; exit %s after SIGTERM during one:\n%s", len(domains), reloadCPU, took.Round(time.Millisecond), after)
}

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
