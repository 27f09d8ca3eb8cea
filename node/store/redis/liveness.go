package redis

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/node"
)

// This file tells a Redis that does not answer from a node that does not
// get to its answers in time. Every connection the store's clients open is
// watched: when a command was last written on it, and whether anything has
// come back since, read or waiting in the socket to be read. A call whose
// deadline passes is Redis's failure only if Redis has left a command
// unanswered on some connection for a good part of the call timeout
// (1/stallShare of it) beyond twice the process's own recent lateness
// (schedlag.go). Otherwise Redis was answering, or had no fair
// chance to, and the call waited inside quotad — queued behind other
// calls, its reply read late by a process too busy to run its goroutines,
// or Redis itself starved of processors by a node that keeps its machine
// busy: the node is overloaded (node.ErrOverloaded), which the circuit
// breaker does not count and the failure mode does not answer.

// stallShare: Redis is taken to be failing when it has left a command
// unanswered for 1/stallShare of the call timeout, plus lagFactor times the
// process's own recent lateness. A Redis that answers in microseconds never comes near
// it however busy the node is (its replies wait in the socket, where they
// are seen); a Redis slower than the timeout, stopped or cut off reaches
// it before a call's deadline, for the call's own command if no other,
// as long as the node keeps up.
const stallShare = 2

// lagFactor is how many times the process's own recent lateness a silence
// of Redis must last beyond timeout/stallShare to be Redis's: the
// lateness is measured on a sample of the process's goroutines, and a
// Redis on a machine that keeps the process waiting that long waits
// about as long to run, or longer.
const lagFactor = 2

// errOverloaded is a call's error when its deadline passed while Redis
// was answering.
var errOverloaded = fmt.Errorf("%w: the call's deadline passed inside quotad while Redis was answering", node.ErrOverloaded)

// liveness watches the connections of the store's clients. Safe for
// concurrent use.
type liveness struct {
	epoch time.Time
	mu    sync.RWMutex
	conns map[*watchedConn]struct{}
	// heard is when bytes last came back on any connection, dialFailed
	// when a connection last failed to open (liveness.now; 0 never).
	heard, dialFailed atomic.Int64
	sched             *schedLag
}

func newLiveness() *liveness {
	return &liveness{epoch: time.Now(), conns: make(map[*watchedConn]struct{}), sched: startSchedLag()}
}

// now is the time since l.epoch, in ns: monotonic, and never 0.
func (l *liveness) now() int64 { return int64(time.Since(l.epoch)) + 1 }

// watch makes every connection c opens from now on a watched one: on
// Redis Cluster, those of each node's client.
func (l *liveness) watch(c goredis.UniversalClient) {
	switch c := c.(type) {
	case *goredis.ClusterClient:
		c.OnNewNode(func(node *goredis.Client) { node.AddHook(dialHook{l}) })
	default:
		c.AddHook(dialHook{l})
	}
}

// missed is the error of a call whose deadline (timeout after it was
// queued) passed before its reply came: context.DeadlineExceeded when
// Redis has left a command unanswered for timeout/stallShare beyond the
// process's recent lateness, else errOverloaded. A process that runs
// later than a call timeout cannot judge Redis at all: it sheds its
// calls until it catches up (a Redis down meanwhile lightens its load).
func (l *liveness) missed(timeout time.Duration) error {
	if l.stalled(timeout/stallShare + lagFactor*l.sched.lag()) {
		return context.DeadlineExceeded
	}
	return errOverloaded
}

// close stops the watch's readings of the process's lateness.
func (l *liveness) close() { l.sched.close() }

// stalled reports whether Redis has left a command unanswered for at least
// d: a connection written to at least d ago with nothing come back since,
// neither read nor waiting to be read. Or whether Redis cannot be reached:
// a connection failed to open (refused, or not opened within
// ConnectTimeout) after the last reply came. How long a connection has
// been opening says nothing: on a busy node, the goroutine that opens it
// waits to run like any other.
func (l *liveness) stalled(d time.Duration) bool {
	if f := l.dialFailed.Load(); f > l.heard.Load() {
		return true
	}
	cut := l.now() - int64(d)
	var suspects []*watchedConn
	l.mu.RLock()
	for c := range l.conns {
		if w := c.wrote.Load(); w > c.answered.Load() && w <= cut {
			suspects = append(suspects, c)
		}
	}
	l.mu.RUnlock()
	for _, c := range suspects {
		w := c.wrote.Load()
		// Looked at again after the peek: a reply read meanwhile left the
		// socket but marked the connection answered (and the connection may
		// since carry a later command, which is not the one judged).
		if !c.replyWaiting() && w <= cut && c.wrote.Load() == w && w > c.answered.Load() {
			return true
		}
	}
	return false
}

// dialHook is the go-redis hook that watches the connections a client
// opens; it leaves commands alone.
type dialHook struct{ l *liveness }

func (h dialHook) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		l := h.l
		conn, err := next(ctx, network, addr)
		if err != nil {
			// Not when the caller gave up on it: that says nothing of
			// Redis.
			if ctx.Err() == nil {
				l.dialFailed.Store(l.now())
			}
			return nil, err
		}
		w := &watchedConn{Conn: conn, l: l}
		l.mu.Lock()
		l.conns[w] = struct{}{}
		l.mu.Unlock()
		// go-redis checks a pooled connection's health through its
		// syscall.Conn, when it has one.
		if _, ok := conn.(syscall.Conn); ok {
			return watchedSyscallConn{w}, nil
		}
		return w, nil
	}
}

func (dialHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// watchedConn is a connection to Redis that notes when it was last
// written to and whether anything has come back since. go-redis writes a
// round trip's commands, then reads their replies, then hands the
// connection to the next round trip, so whatever comes back after a write
// answers it.
type watchedConn struct {
	net.Conn
	l *liveness
	// wrote is when the last Write returned (liveness.now), 0 before any;
	// answered is what wrote was when bytes last came back.
	wrote, answered atomic.Int64
	forgotten       sync.Once
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.wrote.Store(c.l.now())
	}
	return n, err
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.answered.Store(c.wrote.Load())
		c.l.heard.Store(c.l.now())
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.forgotten.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// replyWaiting reports whether bytes from Redis wait in c's socket to be
// read (or Redis closed it): Redis answered, and the node has not read it
// yet. Where the socket cannot be looked at, it reports false.
func (c *watchedConn) replyWaiting() bool {
	raw := c.Conn
	if t, ok := raw.(*tls.Conn); ok {
		raw = t.NetConn()
	}
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	waiting := false
	_ = rc.Control(func(fd uintptr) { waiting = peek(fd) })
	return waiting
}

// watchedSyscallConn is a watchedConn over a connection with a
// syscall.Conn, which it keeps.
type watchedSyscallConn struct{ *watchedConn }

func (c watchedSyscallConn) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}
