// Package redistest starts real redis-server processes for tests, each on a
// free loopback port in its own temporary directory, and stops them when the
// test ends. It never touches a Redis it did not start.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
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

// Binary returns the path of redis-server, failing the test with the install
// command when it is missing.
func Binary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
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
	args := append([]string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
	}, s.args...)
	logFile, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start redis-server: %w", err)
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

// Do sends one command over a fresh connection and returns the reply's
// first line (for simple replies) or an error for a Redis error reply.
// It is meant for test set-up (FLUSHALL, CONFIG SET), not for decoding data.
func (s *Server) Do(args ...string) (string, error) {
	return do(s.Addr(), args...)
}

func ping(addr string) error {
	reply, err := do(addr, "PING")
	if err != nil {
		return err
	}
	if reply != "PONG" {
		return fmt.Errorf("PING answered %q", reply)
	}
	return nil
}

func do(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '-':
		return "", errors.New(line[1:])
	case '+', ':', '$', '*':
		return line[1:], nil
	}
	return line, nil
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
