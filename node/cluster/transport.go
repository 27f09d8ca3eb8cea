package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// This file is memberlist's network transport (UDP packets, TCP streams
// on one port), as memberlist's NetTransport does it but for one thing:
// NetTransport reads every UDP packet into a fresh 64 KiB buffer and
// hands memberlist that buffer, so each packet costs 64 KiB of zeroed,
// collected memory, whatever its size (gossip packets are under 1.4 KB).
// Under a flood of packets at the gossip port (forged or
// replayed gossip) that was most of a node's allocations. This transport
// reads into one buffer it keeps and hands memberlist a copy of the
// packet's own length. Streams, dials, writes and the advertised address
// are NetTransport's; so is Shutdown, except that it also ends a reader
// waiting to hand over what it read (see Shutdown).

// udpPacketBufSize is the largest UDP packet read whole (memberlist's).
const udpPacketBufSize = 65536

// udpRecvBufSize is the socket receive buffer asked for, halved until the
// system grants it (memberlist's).
const udpRecvBufSize = 2 << 20

// netTransport is a memberlist.NodeAwareTransport on one host:port, UDP
// and TCP alike. Its methods are safe for concurrent use.
type netTransport struct {
	bindIP   string
	logger   *log.Logger
	tcp      *net.TCPListener
	udp      *net.UDPConn
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	closing  atomic.Bool
	// done is closed by the first Shutdown: a reader waiting to hand over
	// a packet or a connection stops waiting.
	done chan struct{}
	wg   sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*netTransport)(nil)

// newNetTransport listens on ip:port, TCP and UDP; port 0 takes a free
// port (the same for both, trying a few when another process holds the
// UDP port of a free TCP one). ip "" or "0.0.0.0" is every interface.
func newNetTransport(ip string, port int, logger *log.Logger) (*netTransport, error) {
	if ip == "" {
		ip = "0.0.0.0"
	}
	tries := 1
	if port == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var t *netTransport
		if t, err = listenTransport(ip, port, logger); err == nil {
			t.wg.Add(2)
			go t.acceptStreams()
			go t.readPackets()
			return t, nil
		}
	}
	return nil, err
}

func listenTransport(ip string, port int, logger *log.Logger) (*netTransport, error) {
	addr := net.ParseIP(ip)
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: addr, Port: port})
	if err != nil {
		return nil, fmt.Errorf("listen on TCP %s port %d: %w", ip, port, err)
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: addr, Port: port})
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("listen on UDP %s port %d: %w", ip, port, err)
	}
	for size := udpRecvBufSize; size > 0; size /= 2 {
		if err = udp.SetReadBuffer(size); err == nil {
			break
		}
	}
	if err != nil {
		tcp.Close()
		udp.Close()
		return nil, fmt.Errorf("size the UDP receive buffer: %w", err)
	}
	return &netTransport{
		bindIP: ip, logger: logger, tcp: tcp, udp: udp,
		packetCh: make(chan *memberlist.Packet), streamCh: make(chan net.Conn),
		done: make(chan struct{}),
	}, nil
}

// port is the port the transport listens on.
func (t *netTransport) port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr implements memberlist.Transport: ip and port when ip
// is given; else the bound IP, or a private IP of this host when bound to
// every interface, with the bound port.
func (t *netTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		addr := net.ParseIP(ip)
		if addr == nil {
			return nil, 0, fmt.Errorf("parse advertise address %q", ip)
		}
		if ip4 := addr.To4(); ip4 != nil {
			addr = ip4
		}
		return addr, port, nil
	}
	if t.bindIP != "0.0.0.0" {
		return t.tcp.Addr().(*net.TCPAddr).IP, t.port(), nil
	}
	private, err := sockaddr.GetPrivateIP()
	if err != nil {
		return nil, 0, fmt.Errorf("get interface addresses: %w", err)
	}
	addr := net.ParseIP(private)
	if addr == nil {
		return nil, 0, errors.New("no private IP address found, and no advertise address given")
	}
	return addr, t.port(), nil
}

// WriteTo implements memberlist.Transport.
func (t *netTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport: one UDP
// packet, from the listening socket.
func (t *netTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	to, err := net.ResolveUDPAddr("udp", a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, to)
	return time.Now(), err
}

// PacketCh implements memberlist.Transport.
func (t *netTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *netTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (t *netTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", a.Addr)
}

// StreamCh implements memberlist.Transport.
func (t *netTransport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown implements memberlist.Transport: it closes both sockets and
// waits for their readers to end; a packet or connection read but not yet
// handed over is dropped. Memberlist calls it while its own handlers still
// read the channels; New calls it again, or instead, after a failed
// memberlist.Create, which may have failed before they started. It may be
// called more than once.
func (t *netTransport) Shutdown() error {
	if t.closing.CompareAndSwap(false, true) {
		close(t.done)
	}
	t.tcp.Close()
	t.udp.Close()
	t.wg.Wait()
	return nil
}

// acceptStreams hands memberlist each TCP connection, backing off (5 ms,
// doubling up to 1 s) while accepting fails.
func (t *netTransport) acceptStreams() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		c, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.closing.Load() {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.logger.Printf("[ERR] memberlist: Error accepting TCP connection: %v", err)
			time.Sleep(delay)
			continue
		}
		delay = 0
		select {
		case t.streamCh <- c:
		case <-t.done:
			c.Close()
			return
		}
	}
}

// readPackets hands memberlist each UDP packet: a copy of its bytes, read
// into the one buffer it keeps.
func (t *netTransport) readPackets() {
	defer t.wg.Done()
	buf := make([]byte, udpPacketBufSize)
	for {
		n, from, err := t.udp.ReadFrom(buf)
		at := time.Now()
		if err != nil {
			if t.closing.Load() {
				return
			}
			t.logger.Printf("[ERR] memberlist: Error reading UDP packet: %v", err)
			continue
		}
		if n < 1 {
			t.logger.Printf("[ERR] memberlist: UDP packet too short (%d bytes) %s", n, memberlist.LogAddress(from))
			continue
		}
		select {
		case t.packetCh <- &memberlist.Packet{Buf: bytes.Clone(buf[:n]), From: from, Timestamp: at}:
		case <-t.done:
			return
		}
	}
}
