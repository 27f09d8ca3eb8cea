package attack

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// tapKeeps is how many datagrams a Tap keeps: the latest.
const tapKeeps = 4096

// Tap stands on the wire in front of a memberlist node's gossip port, as
// an eavesdropper would: the node advertises the Tap's address
// (--cluster-advertise), so its peers send to the Tap, which passes every
// UDP datagram and TCP stream on to the node's real address and keeps a
// copy of the latest datagrams. It listens on one port of 127.0.0.1 for
// both. Its methods are safe for concurrent use.
type Tap struct {
	udp *net.UDPConn
	tcp net.Listener
	wg  sync.WaitGroup

	mu       sync.Mutex
	target   string
	out      *net.UDPConn
	copyTo   *net.UDPConn
	captured [][]byte // a ring of tapKeeps, the next at n % tapKeeps
	n        int
}

// StartTap listens on a free port of 127.0.0.1, TCP and UDP alike. It
// passes nothing on until Forward names the node.
func StartTap() (*Tap, error) {
	var lastErr error
	for range 5 {
		tcp, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: tcp.Addr().(*net.TCPAddr).Port})
		if err != nil { // the UDP port is someone else's: try another
			tcp.Close()
			lastErr = err
			continue
		}
		t := &Tap{udp: udp, tcp: tcp}
		t.wg.Add(2)
		go t.relayUDP()
		go t.acceptTCP()
		return t, nil
	}
	return nil, fmt.Errorf("tap: no port free for both TCP and UDP: %w", lastErr)
}

// Addr is the Tap's host:port, for the node to advertise.
func (t *Tap) Addr() string { return t.tcp.Addr().String() }

// Forward passes what arrives on to target, the node's real gossip
// host:port.
func (t *Tap) Forward(target string) error {
	a, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return err
	}
	out, err := net.DialUDP("udp", nil, a)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.out != nil {
		t.out.Close()
	}
	t.target, t.out = target, out
	return nil
}

// CopyTo sends a copy of every datagram that passes, from now on, to
// addr (host:port): another eavesdropper's Tap, say, that forwards
// nothing and only captures, in another process.
func (t *Tap) CopyTo(addr string) error {
	a, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return err
	}
	c, err := net.DialUDP("udp", nil, a)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.copyTo != nil {
		t.copyTo.Close()
	}
	t.copyTo = c
	return nil
}

// Captured returns copies of the latest datagrams that passed, oldest
// first.
func (t *Tap) Captured() [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := min(t.n, tapKeeps)
	out := make([][]byte, 0, k)
	for i := t.n - k; i < t.n; i++ {
		out = append(out, bytes.Clone(t.captured[i%tapKeeps]))
	}
	return out
}

// Close stops the Tap: it takes no more datagrams or streams (those under
// way run to their end).
func (t *Tap) Close() error {
	err := errors.Join(t.udp.Close(), t.tcp.Close())
	t.wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.out != nil {
		t.out.Close()
	}
	if t.copyTo != nil {
		t.copyTo.Close()
	}
	return err
}

func (t *Tap) relayUDP() {
	defer t.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, _, err := t.udp.ReadFromUDP(buf)
		if err != nil {
			return
		}
		t.mu.Lock()
		if t.captured == nil {
			t.captured = make([][]byte, tapKeeps)
		}
		t.captured[t.n%tapKeeps] = append(t.captured[t.n%tapKeeps][:0], buf[:n]...)
		t.n++
		out, copyTo := t.out, t.copyTo
		t.mu.Unlock()
		if out != nil {
			// The node answers pings at the address in them, not at the
			// Tap's, so nothing comes back this way.
			_, _ = out.Write(buf[:n])
		}
		if copyTo != nil {
			_, _ = copyTo.Write(buf[:n])
		}
	}
}

func (t *Tap) acceptTCP() {
	defer t.wg.Done()
	for {
		in, err := t.tcp.Accept()
		if err != nil {
			return
		}
		t.mu.Lock()
		target := t.target
		t.mu.Unlock()
		go func() {
			defer in.Close()
			if target == "" {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(out, in)
				out.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			_, _ = io.Copy(in, out)
			in.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}
