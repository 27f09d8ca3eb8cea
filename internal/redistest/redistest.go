// Package redistest starts real redis-server processes for tests, each on a
// free loopback port in its own temporary directory, and stops them when the
// test ends. It never touches a Redis it did not start.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// InstallHint is what a test prints when redis-server is missing.
const InstallHint = "redis-server not found on PATH: run `make test` (it installs it), or `apt-get update && apt-get install -y redis-server`"

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	args []string
	port int
	// conf, when set, is a config file in dir passed before every other
	// argument (Sentinel needs one it can rewrite).
	conf string
	// cluster makes the server a Redis Cluster node whose bus listens on
	// busPort, chosen with port (the default, port+10000, may be out of
	// range).
	cluster bool
	busPort int
	// ownSchedGroup starts the server in a scheduling group of its own (setsid), at a raised
	// priority (OwnMachine).
	ownSchedGroup bool
	// tlsPort, when set, is the port the server serves TLS on (WithTLS).
	tlsPort int

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// Option adjusts the redis-server command line.
type Option func(*Server)

// WithArgs appends redis-server arguments, e.g. "--appendonly", "yes".
func WithArgs(args ...string) Option {
	return func(s *Server) { s.args = append(s.args, args...) }
}

// WithDurableWrites makes every write the server acknowledged survive Kill
// and Restart: the append-only file is fsynced before each reply.
func WithDurableWrites() Option {
	return WithArgs("--appendonly", "yes", "--appendfsync", "always")
}

// OwnMachine makes the server behave as a Redis on a machine of its own
// would, for tests that keep every core of this one busy (a node driven
// past its CPU): it runs in a scheduling group of its own (setsid), so that
// where Linux schedules by such groups (autogroup, the default on most
// distributions) it
// gets a share of the processors of its own, and, where the test may
// (root, or CAP_SYS_NICE), at a raised priority. Without them a healthy
// Redis beside such a test answers tens or hundreds of milliseconds late,
// and a node rightly takes it for a slow one.
func OwnMachine() Option {
	return func(s *Server) { s.ownSchedGroup = true }
}

// withConfigFile writes text to name in the server's directory and starts
// the server with that file as its config.
func withConfigFile(name, text string) Option {
	return func(s *Server) {
		s.conf = filepath.Join(s.dir, name)
		if err := os.WriteFile(s.conf, []byte(text), 0o644); err != nil {
			s.t.Fatalf("redistest: write %s: %v", name, err)
		}
	}
}

// Binary returns the path of redis-server, failing the test with the install
// command when it is missing.
func Binary(t testing.TB) string {
	t.Helper()
	return lookPath(t, "redis-server")
}

// lookPath returns the path of one of Redis's programs, failing the test
// with the install command when it is missing.
func lookPath(t testing.TB, program string) string {
	t.Helper()
	bin, err := exec.LookPath(program)
	if err != nil {
		t.Fatal(InstallHint)
	}
	return bin
}

// Start starts a redis-server on a free 127.0.0.1 port and waits until it
// answers PING. The server is killed when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir()}
	for _, o := range opts {
		o(s)
	}
	var err error
	// A port found free can be taken by someone else before redis binds it;
	// a failed start is retried on a fresh port, and three failures fail the test.
	for range 3 {
		if s.port, err = FreePort(); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		if s.cluster {
			if s.busPort, err = FreePort(); err != nil {
				t.Fatalf("redistest: %v", err)
			}
		}
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Kill)
	return s
}

// FreePort binds 127.0.0.1:0, notes the port the kernel chose and releases
// it. A failed bind is an error.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("bind a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Addr is the server's "127.0.0.1:PORT".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the server's redis:// URL, as quotad's --redis flag takes it.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// Dir is the server's working directory (its data files and log).
func (s *Server) Dir() string { return s.dir }

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var args []string
	if s.conf != "" {
		args = append(args, s.conf)
	}
	args = append(append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
	), s.args...)
	if s.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", // in dir, kept across restarts
			"--cluster-port", strconv.Itoa(s.busPort))
	}
	logFile, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if s.ownSchedGroup {
		cmd.SysProcAttr = ownSchedGroupAttr()
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start redis-server: %w", err)
	}
	if s.ownSchedGroup {
		if err := raisePriority(cmd.Process.Pid); err != nil {
			s.t.Logf("redistest: redis-server keeps the default priority (%v): a test that keeps every core busy may make it answer late", err)
		}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.Addr()); err == nil {
			s.cmd, s.log = cmd, logFile
			// Keep reaping: the goroutine above owns Wait.
			go func() { <-exited }()
			return nil
		}
		select {
		case err := <-exited:
			logFile.Close()
			return fmt.Errorf("redis-server on port %d exited (%v): %s", s.port, err, tail(filepath.Join(s.dir, "redis.log")))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			logFile.Close()
			return fmt.Errorf("redis-server on port %d did not answer PING within 10s", s.port)
		}
	}
}

// Kill stops the server at once (SIGKILL), as a crash would. It is safe to
// call more than once.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	// Wait until the port no longer answers so a restart can bind it.
	for range 500 {
		if ping(s.Addr()) != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.log.Close()
	s.cmd, s.log = nil, nil
}

// Restart starts the server again on the same port and directory after Kill.
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	// The kernel may hold the port briefly after the kill.
	for range 50 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart: %v", err)
}

// Do sends one command over a fresh connection and returns its reply as
// text: a simple or bulk string as it is, an integer in decimal, a null as
// "". An array reply is an error (use DoList), and so is a Redis error
// reply. It is meant for test set-up and inspection, not for load.
func (s *Server) Do(args ...string) (string, error) {
	return doText(s.Addr(), args...)
}

// DoList is Do for a command whose reply is a flat array (SCRIPT EXISTS,
// CLUSTER GETKEYSINSLOT): each element as Do would return it.
func (s *Server) DoList(args ...string) ([]string, error) {
	return doList(s.Addr(), args...)
}

func ping(addr string) error {
	reply, err := doText(addr, "PING")
	if err != nil {
		return err
	}
	if reply != "PONG" {
		return fmt.Errorf("PING answered %q", reply)
	}
	return nil
}

func doText(addr string, args ...string) (string, error) {
	reply, err := do(addr, args...)
	if err != nil {
		return "", err
	}
	return text(reply, args)
}

func doList(addr string, args ...string) ([]string, error) {
	reply, err := do(addr, args...)
	if err != nil {
		return nil, err
	}
	elems, ok := reply.([]any)
	if !ok {
		return nil, fmt.Errorf("%s: reply %v is not an array", args[0], reply)
	}
	out := make([]string, len(elems))
	for i, e := range elems {
		if out[i], err = text(e, args); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// text is a non-array reply as Do returns it.
func text(reply any, args []string) (string, error) {
	switch v := reply.(type) {
	case string:
		return v, nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case nil:
		return "", nil
	}
	return "", fmt.Errorf("%s: reply %v is an array", args[0], reply)
}

// do sends one command over a fresh connection and reads its whole reply:
// string (simple or bulk), int64, nil (a null) or []any (an array of these).
// A Redis error reply is returned as an error carrying its text.
func do(addr string, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn))
}

// readReply reads one RESP2 reply. An error reply nested in an array is
// returned as the whole reply's error.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, errors.New(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err // "$-1" is a null
		}
		buf := make([]byte, n+2) // the bulk and its CRLF
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err // "*-1" is a null
		}
		elems := make([]any, n)
		for i := range elems {
			if elems[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return elems, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}

// Info returns one field of an INFO-style reply (INFO, CLUSTER INFO):
// the value of the "name:value" line, or "" when there is none.
func (s *Server) Info(command, name string) (string, error) {
	reply, err := s.Do(strings.Fields(command)...)
	if err != nil {
		return "", err
	}
	return infoField(reply, name), nil
}

func infoField(reply, name string) string {
	for line := range strings.Lines(reply) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), name+":"); ok {
			return v
		}
	}
	return ""
}

// waitFor polls cond every few milliseconds until it returns nil, failing
// t with cond's last error when timeout passes first.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
