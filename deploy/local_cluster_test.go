package deploy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
)

// localCluster runs `make cluster` (which runs local-cluster.sh) on the
// given ports, in its own process group, which the test ends.
type localCluster struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    strings.Builder // stdout and stderr, interleaved
	lines  chan string
	exited chan error
}

func startLocalCluster(t *testing.T, redisPort, apiPort, gossipPort int) *localCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed: make redis-server (or apt-get install redis-server)")
	}
	// Through `make cluster`, as docs/cluster.md says to run it.
	cmd := exec.Command("make", "--no-print-directory", "-C", "..", "cluster", "CLUSTER_BIN="+quotadtest.Binary(t),
		"CLUSTER_REDIS_PORT="+strconv.Itoa(redisPort), "CLUSTER_API_PORT="+strconv.Itoa(apiPort),
		"CLUSTER_GOSSIP_PORT="+strconv.Itoa(gossipPort))
	cmd.Env = append(os.Environ(), "CLUSTER_START_TIMEOUT=60", "CLUSTER_DIR="+t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	c := &localCluster{cmd: cmd, lines: make(chan string, 100), exited: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := bufio.NewScanner(pr)
		for s.Scan() {
			c.mu.Lock()
			c.out.WriteString(s.Text() + "\n")
			c.mu.Unlock()
			select {
			case c.lines <- s.Text():
			default:
			}
		}
	}()
	go func() {
		err := cmd.Wait()
		pw.Close()
		c.exited <- err
	}()
	t.Cleanup(func() {
		// The script's own process group: the script and what it started.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	})
	return c
}

func (c *localCluster) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// waitOutput waits until the output matches re.
func (c *localCluster) waitOutput(t *testing.T, re *regexp.Regexp, within time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(c.output()); m != nil {
			return m
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no %q within %s; output:\n%s", re, within, c.output())
	return nil
}

func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		p, err := redistest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, p)
	}
	return ports
}

// make cluster refuses a taken Redis port loudly instead of letting the
// nodes use whatever Redis listens there.
func TestLocalClusterRefusesATakenPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	ports := freePorts(t, 2)
	c := startLocalCluster(t, taken, ports[0], ports[1])
	select {
	case err := <-c.exited:
		if err == nil {
			t.Fatalf("the script succeeded on a taken port:\n%s", c.output())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the script still runs on a taken port:\n%s", c.output())
	}
	want := fmt.Sprintf("127.0.0.1:%d, the Redis port, is already in use", taken)
	if out := c.output(); !strings.Contains(out, want) || !strings.Contains(out, "CLUSTER_REDIS_PORT") {
		t.Fatalf("output does not say %q and name CLUSTER_REDIS_PORT:\n%s", want, out)
	}
}

// make cluster waits for its Redis and its three nodes, then says when a
// node dies and keeps the others running; SIGTERM stops it all.
func TestLocalClusterStartsWaitsAndReportsADeadNode(t *testing.T) {
	ports := freePorts(t, 3)
	redisPort, apiPort := ports[0], ports[1]
	c := startLocalCluster(t, redisPort, apiPort, ports[2])
	c.waitOutput(t, regexp.MustCompile(`cluster up`), 120*time.Second)
	for i := 1; i <= 3; i++ {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.%d:%d/healthz", i, apiPort))
		if err != nil {
			t.Fatalf("node-%d: %v\n%s", i, err, c.output())
		}
		resp.Body.Close()
	}
	quickStartAnswersAsTheDocSays(t, apiPort)
	m := c.waitOutput(t, regexp.MustCompile(`node-2: \S+ \(pid (\d+),`), time.Second)
	pid, _ := strconv.Atoi(m[1])
	// The node is the script's child, in the process group the test made.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.waitOutput(t, regexp.MustCompile(fmt.Sprintf(`node-2 \(pid %d\) exited with status`, pid)), 30*time.Second)
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", apiPort))
	if err != nil {
		t.Fatalf("node-1 stopped with node-2: %v", err)
	}
	resp.Body.Close()

	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the script did not stop on SIGTERM:\n%s", c.output())
	}
	// Everything it started is gone: Redis no longer listens.
	deadline := time.Now().Add(15 * time.Second)
	for {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", redisPort))
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatal("redis-server still listens after the script stopped")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// quickStartAnswersAsTheDocSays runs docs/cluster.md's Quick start
// commands against the cluster on apiPort: node-2 sees three members
// alive; of six checks of one key round the nodes, the first five are
// allowed and the sixth denied.
func quickStartAnswersAsTheDocSays(t *testing.T, apiPort int) {
	t.Helper()
	page, err := os.ReadFile("../docs/cluster.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(page), "## Quick start\n")
	fences := strings.Split(rest, "```")
	if !ok || len(fences) < 4 || !strings.HasPrefix(fences[3], "sh\n") {
		t.Fatal("docs/cluster.md's Quick start no longer has its second shell block where this test reads it")
	}
	script := strings.ReplaceAll(strings.TrimPrefix(fences[3], "sh\n"), ":8080", ":"+strconv.Itoa(apiPort))
	out, err := exec.Command("bash", "-euo", "pipefail", "-c", script).Output()
	if err != nil {
		t.Fatalf("the Quick start commands failed: %v\n%s", err, out)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	var view struct {
		Members []struct {
			State string `json:"state"`
		} `json:"members"`
	}
	if err := dec.Decode(&view); err != nil {
		t.Fatalf("node-2's view: %v\n%s", err, out)
	}
	alive := 0
	for _, m := range view.Members {
		if m.State == "alive" {
			alive++
		}
	}
	if alive != 3 {
		t.Errorf("node-2's view has %d members alive, want 3:\n%s", alive, out)
	}
	for i := 0; dec.More(); i++ {
		var a struct {
			Allowed bool `json:"allowed"`
		}
		if err := dec.Decode(&a); err != nil {
			t.Fatalf("check %d: %v\n%s", i+1, err, out)
		}
		if a.Allowed != (i < 5) || i >= 6 {
			t.Errorf("check %d allowed %v; want six answers, the first five allowed and the sixth denied:\n%s", i+1, a.Allowed, out)
		}
	}
}
