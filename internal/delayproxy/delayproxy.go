// Package delayproxy is a TCP proxy for tests that makes a server look far
// away or stalled: it adds a one-way delay to each direction and can hold
// all traffic for a while, as a network with latency or a SIGSTOPped server
// would. Test helper only.
package delayproxy

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards every connection made to Addr to the target. Bytes keep
// their order; each chunk is delivered its direction's delay after the
// proxy read it (never before a stall ends), without limiting throughput:
// many chunks can be in flight at once, as on a long fat pipe. Connecting
// to the proxy costs no delay (the kernel accepts at once, as it accepts
// into a stopped server's backlog); only bytes do. Safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu          sync.Mutex
	up, down    time.Duration // client → target, target → client
	stalledTill time.Time
	conns       map[net.Conn]struct{}
	closed      bool
	wg          sync.WaitGroup
}

// Start listens on a free 127.0.0.1 port and forwards to target
// (host:port), with no delay until SetDelay. It is closed when the test
// ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("delayproxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's "127.0.0.1:PORT": connect here instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay sets the one-way delay of each direction, for chunks read from
// now on: up from the client to the target, down back. A round trip then
// costs up + down.
func (p *Proxy) SetDelay(up, down time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up, p.down = up, down
}

// Stall holds every byte in both directions, those already in flight and
// those sent meanwhile, for d from now; then they flow again, each no
// sooner than its own delay. It does not block. It returns when the stall
// ends.
func (p *Proxy) Stall(d time.Duration) (ends time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalledTill = time.Now().Add(d)
	return p.stalledTill
}

// Close stops accepting and cuts every connection. It is safe to call more
// than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(2)
		go p.pipe(client, server, func() time.Duration { return p.delay(true) })
		go p.pipe(server, client, func() time.Duration { return p.delay(false) })
	}
}

// track registers the connections for Close; false when already closed.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) delay(up bool) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if up {
		return p.up
	}
	return p.down
}

// stallEnd is when the current stall ends (zero or past when none).
func (p *Proxy) stallEnd() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stalledTill
}

// chunk is bytes read from one side and when they may be written.
type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, each chunk delayed; when src ends, both close
// once what was read has been delivered.
func (p *Proxy) pipe(src, dst net.Conn, delay func() time.Duration) {
	defer p.wg.Done()
	q := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			// Wait for the chunk's own delay, then for any stall; a stall
			// may start while waiting.
			for {
				wait := time.Until(c.due)
				if end := time.Until(p.stallEnd()); end > wait {
					wait = end
				}
				if wait <= 0 {
					break
				}
				time.Sleep(min(wait, 5*time.Millisecond))
			}
			if _, err := dst.Write(c.b); err != nil {
				break
			}
		}
		for range q { // drain after a write error so the reader never blocks
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(delay())}
		}
		if err != nil { // EOF, reset or Close: the other side learns by the close below
			break
		}
	}
	close(q)
	<-done
	p.mu.Lock()
	delete(p.conns, src)
	delete(p.conns, dst)
	p.mu.Unlock()
	src.Close()
	dst.Close()
}
