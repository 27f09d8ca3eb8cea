// Package memcachedtest starts real memcached processes for tests, each on
// a free loopback port, and stops them when the test ends. It never
// touches a memcached it did not start.
package memcachedtest

import (
	"bufio"
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

	"github.com/quotad/quotad/internal/redistest"
)

// InstallHint is what a test prints when memcached is missing.
const InstallHint = "memcached not found on PATH: run `make test` (it installs it), or `apt-get update && apt-get install -y memcached`"

// Server is one memcached process owned by a test.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	// tlsPort, when set, is the port the server serves TLS on (WithTLS),
	// with tlsArgs.
	tlsPort int
	tlsArgs []string

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// Option adjusts the memcached command line.
type Option func(*Server)

// WithTLS makes the server serve TLS as well, on a port of its own
// (TLSAddr), with certPEM and keyPEM; requireClientCert makes it refuse a
// client that presents no certificate caPEM's authorities signed. The
// plaintext port stays, for the test's own commands (Do).
func WithTLS(certPEM, keyPEM, caPEM []byte, requireClientCert bool) Option {
	return func(s *Server) {
		s.t.Helper()
		write := func(name string, data []byte) string {
			p := filepath.Join(s.dir, name)
			if err := os.WriteFile(p, data, 0o600); err != nil {
				s.t.Fatalf("memcachedtest: %v", err)
			}
			return p
		}
		port, err := redistest.FreePort()
		if err != nil {
			s.t.Fatalf("memcachedtest: %v", err)
		}
		s.tlsPort = port
		// ssl_verify_mode 2 requires a client certificate, 0 asks for none.
		mode := "0"
		if requireClientCert {
			mode = "2"
		}
		s.tlsArgs = []string{"-Z", "-o", "ssl_chain_cert=" + write("tls.crt", certPEM) + ",ssl_key=" + write("tls.key", keyPEM) +
			",ssl_ca_cert=" + write("tls-ca.pem", caPEM) + ",ssl_verify_mode=" + mode}
	}
}

// TLSAddr is the server's TLS address, 127.0.0.1:port, when it was
// started WithTLS; "" otherwise.
func (s *Server) TLSAddr() string {
	if s.tlsPort == 0 {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tlsPort))
}

// Start starts a memcached on a free 127.0.0.1 port (TCP only, 64 MiB),
// adjusted by opts, and waits until it answers "version". The server is killed when the
// test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		t.Fatal(InstallHint)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	for _, o := range opts {
		o(s)
	}
	// A port found free can be taken before memcached binds it: a failed
	// start is retried on a fresh port, and three failures fail the test.
	for range 3 {
		if s.port, err = redistest.FreePort(); err != nil {
			t.Fatalf("memcachedtest: %v", err)
		}
		if err = s.start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("memcachedtest: %v", err)
	}
	t.Cleanup(s.Kill)
	return s
}

// Addr is the server's "127.0.0.1:PORT", as --memcache takes it.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	args := []string{"-p", strconv.Itoa(s.port), "-l", "127.0.0.1", "-U", "0", "-m", "64", "-t", "2"}
	if s.tlsPort != 0 {
		// With -Z every listener is TLS but those marked notls.
		args = append([]string{"-l", "notls:127.0.0.1:" + strconv.Itoa(s.port), "-l", "127.0.0.1:" + strconv.Itoa(s.tlsPort),
			"-U", "0", "-m", "64", "-t", "2"}, s.tlsArgs...)
	}
	if os.Geteuid() == 0 {
		// memcached refuses to run as root unless told whom to run as.
		args = append(args, "-u", "root")
	}
	logFile, err := os.OpenFile(filepath.Join(s.dir, "memcached.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start memcached: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := s.Do("version"); err == nil {
			s.cmd, s.log = cmd, logFile
			go func() { <-exited }() // keep reaping: the goroutine above owns Wait
			return nil
		}
		select {
		case err := <-exited:
			logFile.Close()
			log, _ := os.ReadFile(filepath.Join(s.dir, "memcached.log"))
			return fmt.Errorf("memcached on port %d exited (%v): %s", s.port, err, log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			logFile.Close()
			return fmt.Errorf("memcached on port %d did not answer within 10s", s.port)
		}
	}
}

// Kill stops the server at once (SIGKILL), as a crash would, and waits
// until its port no longer answers. It is safe to call more than once.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	for range 500 {
		if _, err := s.Do("version"); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.log.Close()
	s.cmd, s.log = nil, nil
}

// Restart starts the server again on the same port after Kill, empty, as
// memcached always starts.
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	for range 50 { // the kernel may hold the port briefly after the kill
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("memcachedtest: restart: %v", err)
}

// Do sends one line of memcached's text protocol (without its CRLF) over a
// fresh connection and returns the reply's lines up to the one that ends
// it (END, STORED, a number, ...), joined by "\n". It is meant for test
// set-up and inspection, not for load.
func (s *Server) Do(line string) (string, error) {
	conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(line + "\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	var lines []string
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		l = strings.TrimRight(l, "\r\n")
		lines = append(lines, l)
		// Only a get's reply has more than one line: VALUE, data, END.
		if !strings.HasPrefix(l, "VALUE ") && (len(lines) < 2 || !strings.HasPrefix(lines[len(lines)-2], "VALUE ")) {
			return strings.Join(lines, "\n"), nil
		}
	}
}

// Get returns the value stored under key and whether there is one.
func (s *Server) Get(key string) (string, bool, error) {
	reply, err := s.Do("get " + key)
	if err != nil {
		return "", false, err
	}
	lines := strings.Split(reply, "\n")
	if len(lines) == 3 && strings.HasPrefix(lines[0], "VALUE ") && lines[2] == "END" {
		return lines[1], true, nil
	}
	if reply == "END" {
		return "", false, nil
	}
	return "", false, fmt.Errorf("get %s: unexpected reply %q", key, reply)
}
