package cluster_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// faultNet is an in-memory network for memberlist that can lose packets,
// partition nodes and crash them. Each end has its own IP (10.0.0.N) on
// port 7946, as pods behind a headless service do.
//
// It is not memberlist's MockNetwork: that one's address maps are not
// guarded, so ends cannot be added while others run, and its sends block
// until the receiver reads, so a send to a node that has shut down hangs
// the sender's probe loop for good — exactly what crash tests need to
// survive. Here a send to an unreachable end is lost, as UDP would lose
// it, and a dial to one fails.
type faultNet struct {
	mu     sync.Mutex
	ends   map[string]*faultEnd // by "ip:port"
	cut    map[[2]string]bool   // address pairs that cannot reach each other
	lossPc int                  // percent of packets lost (streams are reliable)
	rng    *rand.Rand
}

func newFaultNet() *faultNet {
	return &faultNet{ends: map[string]*faultEnd{}, cut: map[[2]string]bool{}, rng: rand.New(rand.NewPCG(1, 2))}
}

const faultPort = 7946

// newEnd returns a transport at the next free address.
func (n *faultNet) newEnd() *faultEnd {
	n.mu.Lock()
	defer n.mu.Unlock()
	ip := net.IPv4(10, 0, 0, byte(len(n.ends)+1))
	e := &faultEnd{
		net:     n,
		ip:      ip,
		addr:    net.JoinHostPort(ip.String(), strconv.Itoa(faultPort)),
		from:    &net.UDPAddr{IP: ip, Port: faultPort},
		packets: make(chan *memberlist.Packet, 256),
		streams: make(chan net.Conn, 16),
		down:    make(chan struct{}),
	}
	n.ends[e.addr] = e
	return e
}

// setLoss makes the network lose pc percent of packets.
func (n *faultNet) setLoss(pc int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lossPc = pc
}

// partition cuts every link between ends in different groups.
func (n *faultNet) partition(groups ...[]*faultEnd) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, g := range groups {
		for _, h := range groups[i+1:] {
			for _, a := range g {
				for _, b := range h {
					n.cut[[2]string{a.addr, b.addr}] = true
					n.cut[[2]string{b.addr, a.addr}] = true
				}
			}
		}
	}
}

// heal restores every cut link.
func (n *faultNet) heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
}

// route returns the end at to if from can reach it now; a packet may also
// be lost at random.
func (n *faultNet) route(from *faultEnd, to string, packet bool) (*faultEnd, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	dest := n.ends[to]
	if dest == nil || from.isDown() || dest.isDown() || n.cut[[2]string{from.addr, to}] {
		return nil, false
	}
	if packet && n.lossPc > 0 && n.rng.IntN(100) < n.lossPc {
		return nil, false
	}
	return dest, true
}

// faultEnd is one node's transport on a faultNet.
type faultEnd struct {
	net      *faultNet
	ip       net.IP
	addr     string
	from     net.Addr
	packets  chan *memberlist.Packet
	streams  chan net.Conn
	down     chan struct{}
	downOnce sync.Once
}

var _ memberlist.NodeAwareTransport = (*faultEnd)(nil)

// crash cuts the end off at once, as a dead process or a pulled cable
// would: nothing reaches it, nothing it sends arrives.
func (e *faultEnd) crash() { e.downOnce.Do(func() { close(e.down) }) }

func (e *faultEnd) isDown() bool {
	select {
	case <-e.down:
		return true
	default:
		return false
	}
}

func (e *faultEnd) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return e.ip, faultPort, nil
}

func (e *faultEnd) WriteTo(b []byte, addr string) (time.Time, error) {
	return e.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (e *faultEnd) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	dest, ok := e.net.route(e, a.Addr, true)
	if !ok {
		return now, nil // lost, as UDP loses it: no error
	}
	select {
	case dest.packets <- &memberlist.Packet{Buf: bytes.Clone(b), From: e.from, Timestamp: now}:
	default: // the receiver is not keeping up: lost
	}
	return now, nil
}

func (e *faultEnd) PacketCh() <-chan *memberlist.Packet { return e.packets }

func (e *faultEnd) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return e.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (e *faultEnd) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest, ok := e.net.route(e, a.Addr, false)
	if !ok {
		return nil, fmt.Errorf("dial %s: no route to host", a.Addr)
	}
	mine, theirs := net.Pipe()
	select {
	case dest.streams <- theirs:
		return mine, nil
	case <-dest.down:
	case <-time.After(timeout):
	}
	mine.Close()
	theirs.Close()
	return nil, fmt.Errorf("dial %s: timed out", a.Addr)
}

func (e *faultEnd) StreamCh() <-chan net.Conn { return e.streams }

// Shutdown takes the end off the network; memberlist calls it on
// Shutdown.
func (e *faultEnd) Shutdown() error {
	e.crash()
	return nil
}
