package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotad/quotad/internal/redisbench"
)

// The processes a matrix run measures: quotad binaries and the gRPC floor
// it starts itself, or a quotad it is given, and the redis-server.

// startTimeout bounds how long a started server may take to say where it
// listens.
const startTimeout = 60 * time.Second

// listeningLine finds the address in quotad's "quotad listening on
// http://127.0.0.1:PORT ..." and the floor's "listening on 127.0.0.1:PORT".
var listeningLine = regexp.MustCompile(`listening on (?:https?://)?(\S+)`)

// server is one gRPC server the matrix drives.
type server struct {
	// name labels its cells: "grpc-floor", or the quotad target's name.
	name string
	addr string // host:port on loopback
	// pid is read in /proc for CPU and syscalls; 0 when unknown.
	pid  int
	conn *grpc.ClientConn

	cmd   *exec.Cmd      // nil when the matrix was given the server
	stdin io.WriteCloser // the floor stops when it closes
	tail  *tailBuffer    // the end of its stderr, for error messages
	// exited, if not nil, is closed once cmd has exited: its Wait is
	// already running.
	exited chan struct{}
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if n := len(t.buf) - 4096; n > 0 {
		t.buf = append(t.buf[:0], t.buf[n:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// startServer runs path with args and waits until it prints where it
// listens. The process's stdout is drained until it exits.
func startServer(name, path string, args []string) (*server, error) {
	cmd := exec.Command(path, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	s := &server{name: name, cmd: cmd, stdin: stdin, tail: &tailBuffer{}}
	cmd.Stderr = s.tail
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, path, err)
	}
	s.pid = cmd.Process.Pid
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listeningLine.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		close(found)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case addr, ok := <-found:
		if !ok {
			s.stop()
			return nil, fmt.Errorf("%s exited before listening: %s", name, s.tail)
		}
		s.addr = addr
	case <-time.After(startTimeout):
		s.stop()
		return nil, fmt.Errorf("%s did not say where it listens within %s: %s", name, startTimeout, s.tail)
	}
	if err := s.dial(); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// dial opens the one client connection every cell on s shares.
func (s *server) dial() error {
	conn, err := grpc.NewClient("passthrough:///"+s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("%s at %s: %w", s.name, s.addr, err)
	}
	s.conn = conn
	return nil
}

// stop ends a server the matrix started: stdin closed (the floor's signal),
// SIGTERM (quotad's), then SIGKILL if it has not exited within 15 s. A
// given server is only disconnected from.
func (s *server) stop() {
	if s.conn != nil {
		s.conn.Close()
	}
	if s.cmd == nil {
		return
	}
	s.stdin.Close()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := s.exited
	if done == nil {
		done = make(chan struct{})
		go func() {
			_ = s.cmd.Wait()
			close(done)
		}()
	}
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

// redisServer is the Redis every quotad target uses and the Redis floor
// runs against.
type redisServer struct {
	addr    string
	version string
	client  *redisbench.Client // for the floor's INCRBY+PEXPIRE
	stats   *redisStats        // INFO readings
	cmd     *exec.Cmd          // nil when given
	dir     string
}

// startRedis starts path (a redis-server) on a free 127.0.0.1 port with no
// persistence, and waits until it answers.
func startRedis(ctx context.Context, path string) (*redisServer, error) {
	bin, err := exec.LookPath(path)
	if err != nil {
		return nil, fmt.Errorf("-redis-server %s: %w (install it: apt-get install redis-server)", path, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "quotabench-redis-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	tail := &tailBuffer{}
	cmd.Stdout, cmd.Stderr = tail, tail
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	r := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, dir: dir}
	if err := r.connect(ctx); err != nil {
		r.stop()
		return nil, fmt.Errorf("%w: %s", err, tail)
	}
	return r, nil
}

// useRedis connects to a Redis the caller runs.
func useRedis(ctx context.Context, addr string) (*redisServer, error) {
	r := &redisServer{addr: addr}
	if err := r.connect(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *redisServer) connect(ctx context.Context) error {
	var err error
	if r.client, err = redisbench.Dial(r.addr, maxMatrixClients); err != nil {
		return err
	}
	deadline := time.Now().Add(startTimeout)
	for {
		err = r.client.Ping(ctx)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("redis at %s: %w", r.addr, err)
	}
	info, err := r.client.Info(ctx, "server")
	if err != nil {
		return fmt.Errorf("redis at %s: INFO server: %w", r.addr, err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			r.version = v
		}
	}
	if r.stats, err = newRedisStats(r.addr); err != nil {
		return err
	}
	return nil
}

// url is a redis:// URL for quotad on database db.
func (r *redisServer) url(db int) string {
	return "redis://" + r.addr + "/" + strconv.Itoa(db)
}

func (r *redisServer) stop() {
	if r.client != nil {
		r.client.Close()
	}
	if r.stats != nil {
		r.stats.Close()
	}
	if r.cmd != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		os.RemoveAll(r.dir)
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// checkLoopback refuses an address that is not on this machine's loopback:
// the matrix measures local processes and never sends load elsewhere.
func checkLoopback(hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", hostport, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return errors.New(hostport + " is not a loopback address (127.0.0.0/8, ::1 or localhost): the matrix measures processes on this machine only")
	}
	return nil
}
