package cluster_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/attack"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/cluster"
)

// The attacks on gossip, against in-process nodes on real UDP and
// TCP sockets on 127.0.0.1 and one redis-server: raw packets from a socket
// that never joined, and packets captured on the wire played back.

// loopbackCluster starts k nodes called a, b, ... on one Redis, members of
// one cluster gossiping on 127.0.0.1 (each joining the first), and waits
// until each sees all k. tweak, if not nil, adjusts each member's config;
// wrap, if not nil, wraps each member's transport.
func loopbackCluster(t *testing.T, r *redistest.Server, k int, cfg node.Config, tweak func(*cluster.Config), wrap func(i int, tr *memberlist.NetTransport) memberlist.NodeAwareTransport) ([]*node.Node, []*cluster.Membership) {
	t.Helper()
	nodes := make([]*node.Node, k)
	ms := make([]*cluster.Membership, k)
	for i := range k {
		var join []string
		if i > 0 {
			join = []string{ms[0].Addr()}
		}
		ms[i] = startLoopbackMember(t, string(rune('a'+i)), join, tweak, func(tr *memberlist.NetTransport) memberlist.NodeAwareTransport {
			if wrap == nil {
				return tr
			}
			return wrap(i, tr)
		})
		c := cfg
		c.Cluster = ms[i]
		nodes[i] = newNode(t, newRedisStore(t, r), c)
	}
	for _, m := range ms {
		waitFor(t, 20*testDeadAfter, func() (bool, string) {
			return m.Size() == k, fmt.Sprintf("%s sees %d members; want %d", m.Name(), m.Size(), k)
		})
	}
	return nodes, ms
}

// startLoopbackMember starts a membership gossiping on a free port of
// 127.0.0.1 over memberlist's UDP and TCP transport (wrapped by wrap).
func startLoopbackMember(t *testing.T, name string, join []string, tweak func(*cluster.Config), wrap func(*memberlist.NetTransport) memberlist.NodeAwareTransport) *cluster.Membership {
	t.Helper()
	for attempt := 0; ; attempt++ {
		port, err := redistest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		tr, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{"127.0.0.1"}, BindPort: port, Logger: log.New(io.Discard, "", 0),
		})
		if err != nil {
			if attempt < 3 { // the UDP port was taken meanwhile
				continue
			}
			t.Fatal(err)
		}
		cfg := cluster.Config{
			NodeName: name, Join: join, DeadAfter: testDeadAfter, RejoinInterval: 200 * time.Millisecond,
			Transport: wrap(tr),
		}
		if tweak != nil {
			tweak(&cfg)
		}
		m, err := cluster.New(cfg, nil)
		if err != nil {
			tr.Shutdown()
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Shutdown() })
		return m
	}
}

// sendUDP sends each payload as a memberlist user message (type 8) in
// its own datagram, from a fresh socket that never joined anything.
func sendUDP(t *testing.T, to string, payloads ...[]byte) {
	t.Helper()
	c, err := net.Dial("udp", to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, p := range payloads {
		if _, err := c.Write(append([]byte{8}, p...)); err != nil {
			t.Fatal(err)
		}
	}
}

// sendRaw sends each datagram as it is, from a fresh socket.
func sendRaw(t *testing.T, to string, datagrams [][]byte) {
	t.Helper()
	c, err := net.Dial("udp", to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, d := range datagrams {
		if _, err := c.Write(d); err != nil {
			t.Fatal(err)
		}
	}
}

// sendTCP sends payload as a memberlist user message over a fresh TCP
// connection: type 8, the msgpack header {"UserMsgLen": n}, the bytes.
func sendTCP(t *testing.T, to string, payload []byte) {
	t.Helper()
	c, err := net.Dial("tcp", to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := append([]byte{8, 0x81, 0xaa}, "UserMsgLen"...)
	b = append(b, 0xcd)
	b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	if _, err := c.Write(append(b, payload...)); err != nil {
		t.Fatal(err)
	}
}

func gossipOf(m *cluster.Membership) node.GossipStats { return m.Stats().Gossip }

// waitStats waits until cond holds for m's gossip counters.
func waitStats(t *testing.T, m *cluster.Membership, what string, cond func(node.GossipStats) bool) {
	t.Helper()
	waitFor(t, 20*testDeadAfter, func() (bool, string) {
		g := gossipOf(m)
		return cond(g), fmt.Sprintf("%s: waiting for %s; gossip %+v", m.Name(), what, g)
	})
}

// One UDP packet from a process that never joined made
// every node deny a configured policy's key for 100 years. Now a packet
// from anyone but a member is dropped, over UDP or TCP; and one that
// impersonates a member (possible without a key: the cluster is then
// insecure by choice) gets a denial that holds no longer than its limit
// can justify.
func TestForgedGossipDenialIsDroppedOrCapped(t *testing.T) {
	r := redistest.Start(t)
	nodes, ms := loopbackCluster(t, r, 2, node.Config{}, nil, nil)
	a := ms[0]
	api := node.Policy{Name: "api", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1500, Period: 10 * time.Second}}
	hundredYears := 3_153_599_999 * time.Second
	ctx := context.Background()
	source := func(key string) node.Result {
		t.Helper()
		res, err := nodes[0].Check(ctx, api, key, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	// The 33-byte packet (version 1: no sender, no number) ...
	v1 := append([]byte{1}, attack.DenialMessage("api", "victim", api.Limit, 1, hundredYears)...)
	// ... and version 2 from a sender id nobody advertised.
	forged := attack.GossipPacket(0xbad, 1, time.Now(), attack.DenialMessage("api", "victim", api.Limit, 1, hundredYears))
	sendUDP(t, a.Addr(), v1, forged)
	sendTCP(t, a.Addr(), forged)
	waitStats(t, a, "the forged packets", func(g node.GossipStats) bool { return g.Unsupported >= 1 && g.UnknownSender >= 2 })
	if g := gossipOf(a); g.DenialsReceived != 0 {
		t.Fatalf("a applied %d forged denials: %+v", g.DenialsReceived, g)
	}
	if res := source("victim"); !res.Allowed || res.Source != node.SourceStore {
		t.Fatalf("victim after forged packets from outside: %+v; want allowed by the store", res)
	}

	// Impersonating b: its gossip id is in its metadata, which travels in
	// plaintext without a key.
	b := cluster.GossipID(ms[1])
	sendUDP(t, a.Addr(), attack.GossipPacket(b, 1<<40, time.Now(), attack.DenialMessage("api", "victim", api.Limit, 1, hundredYears)))
	sendTCP(t, a.Addr(), attack.GossipPacket(b, 1<<40+1, time.Now(), attack.DenialMessage("api", "victim-tcp", api.Limit, 1, hundredYears)))
	waitStats(t, a, "the impersonated denials", func(g node.GossipStats) bool { return g.DenialsReceived >= 2 })
	if g := gossipOf(a); g.Capped != 2 {
		t.Fatalf("a capped %d of 2 hundred-year denials: %+v", g.Capped, g)
	}
	for _, key := range []string{"victim", "victim-tcp"} {
		res := source(key)
		if res.Allowed || res.Source != node.SourceDeniedCache {
			t.Fatalf("%s: %+v; want the forged denial from the denied cache", key, res)
		}
		if res.RetryAfter > api.Limit.Period || res.ResetAfter > api.Limit.Period {
			t.Fatalf("%s: denied with retry_after %s, reset_after %s; the limit's window is %s", key, res.RetryAfter, res.ResetAfter, api.Limit.Period)
		}
		t.Logf("%s: a forged retry_after of %s is held to %s (fixed window of %s)", key, hundredYears, res.RetryAfter, api.Limit.Period)
	}
}

// recorder is a transport that keeps a copy of every packet its node
// sends to one address, as someone on the wire would capture it.
type recorder struct {
	*memberlist.NetTransport
	mu      sync.Mutex
	to      string
	packets [][]byte
}

func (r *recorder) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	r.mu.Lock()
	if a.Addr == r.to {
		r.packets = append(r.packets, bytes.Clone(b))
	}
	r.mu.Unlock()
	return r.NetTransport.WriteToAddress(b, a)
}

func (r *recorder) WriteTo(b []byte, addr string) (time.Time, error) {
	return r.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (r *recorder) captured() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.packets...)
}

func (r *recorder) recordTo(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.to = addr
}

// Encrypted packets captured on the wire re-armed a
// denial after an admin Reset, from a fresh socket, indefinitely. Now the
// receiver refuses them: once taken, a packet's number is not taken again;
// and a node that never saw them (one that joined later, as a restarted
// node would) refuses them as stale once GossipMaxAge has passed.
func TestReplayedGossipIsRefused(t *testing.T) {
	r := redistest.Start(t)
	key := []byte("0123456789abcdef0123456789abcdef")
	keyed := func(c *cluster.Config) { c.SecretKey = key }
	var wire *recorder
	nodes, ms := loopbackCluster(t, r, 2, node.Config{}, keyed, func(i int, tr *memberlist.NetTransport) memberlist.NodeAwareTransport {
		if i > 0 {
			return tr
		}
		wire = &recorder{NetTransport: tr}
		return wire
	})
	a, b := ms[0], ms[1]
	wire.recordTo(b.Addr())
	ctx := context.Background()
	p := node.Policy{Name: "g", Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 5, Period: time.Hour}}
	check := func(n *node.Node) node.Result {
		t.Helper()
		res, err := n.Check(ctx, p, "abuser", 1)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	for range 5 {
		check(nodes[0])
	}
	if res := check(nodes[0]); res.Allowed || res.Source != node.SourceStore {
		t.Fatalf("sixth check on a: %+v; want denied by Redis", res)
	}
	waitStats(t, b, "the denial", func(g node.GossipStats) bool { return g.DenialsReceived >= 2 }) // both transmissions
	if res := check(nodes[1]); res.Source != node.SourceDeniedCache {
		t.Fatalf("b before the reset: %+v; want the gossiped denial", res)
	}
	waitStats(t, a, "the queue to drain", func(g node.GossipStats) bool { return g.Queued == 0 })
	captured := wire.captured()
	capturedAt := time.Now()
	wire.recordTo("")
	t.Logf("captured %d encrypted packets from a to b, gossip and memberlist's own", len(captured))

	if err := nodes[0].Reset(ctx, "g", "abuser"); err != nil {
		t.Fatal(err)
	}
	waitStats(t, b, "the reset", func(g node.GossipStats) bool { return g.ResetsReceived >= 1 })
	before := gossipOf(b)
	for range 3 {
		sendRaw(t, b.Addr(), captured)
	}
	// Each round replays both transmissions of the denial.
	waitStats(t, b, "the replays", func(g node.GossipStats) bool { return g.Replayed >= before.Replayed+6 })
	if g := gossipOf(b); g.DenialsReceived != before.DenialsReceived {
		t.Fatalf("b applied %d replayed denials: %+v", g.DenialsReceived-before.DenialsReceived, g)
	}
	if res := check(nodes[1]); !res.Allowed || res.Source != node.SourceStore {
		t.Fatalf("b after the reset and the replays: %+v; want allowed by Redis", res)
	}

	// A node that never saw the packets refuses them once they are older
	// than its GossipMaxAge.
	const maxAge = time.Second
	c := startLoopbackMember(t, "c", []string{a.Addr()}, func(c *cluster.Config) {
		keyed(c)
		c.GossipMaxAge = maxAge
	}, func(tr *memberlist.NetTransport) memberlist.NodeAwareTransport { return tr })
	nc := newNode(t, newRedisStore(t, r), node.Config{Cluster: c})
	waitFor(t, 20*testDeadAfter, func() (bool, string) { return c.Size() == 3, fmt.Sprintf("c sees %d members", c.Size()) })
	waitFor(t, 2*maxAge, func() (bool, string) { return time.Since(capturedAt) > maxAge, "the packets are not old yet" })
	for range 3 {
		sendRaw(t, c.Addr(), captured)
	}
	waitStats(t, c, "the stale replays", func(g node.GossipStats) bool { return g.Stale >= 6 })
	if g := gossipOf(c); g.DenialsReceived != 0 {
		t.Fatalf("c applied %d replayed denials: %+v", g.DenialsReceived, g)
	}
	if res := check(nc); res.Source == node.SourceDeniedCache {
		t.Fatalf("c: %+v; a replayed denial armed its cache", res)
	}
	// And a node's own packets, played back to it, are not from a member.
	sendRaw(t, a.Addr(), captured)
	waitStats(t, a, "its own packets", func(g node.GossipStats) bool { return g.UnknownSender >= 2 })
}

// A flood of forged resets burned a core for 85s after
// it ended, because each new reset id scanned all those remembered. Now
// each costs the same and at most 4096 are remembered: the flood is
// processed as it arrives and the bookkeeping stays bounded.
func TestForgedResetFloodIsBounded(t *testing.T) {
	r := redistest.Start(t)
	nodes, ms := loopbackCluster(t, r, 2, node.Config{}, nil, nil)
	a := ms[0]
	impersonated := cluster.GossipID(ms[1]) // insecure: read off the wire
	const (
		perPacket = 40
		perBurst  = 25 // packets: well within memberlist's handler queue
		bursts    = 40 // 40,000 resets in all
	)
	var memBefore runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&memBefore)
	start := time.Now()
	seq, id := uint64(1<<40), uint64(0)
	maxRemembered := 0
	for burst := range bursts {
		datagrams := make([][]byte, perBurst)
		for i := range datagrams {
			msgs := make([][]byte, perPacket)
			for j := range msgs {
				id++
				msgs[j] = attack.ResetMessage(id, "api", "k"+strconv.FormatUint(id, 10))
			}
			seq++
			datagrams[i] = append([]byte{8}, attack.GossipPacket(impersonated, seq, time.Now(), msgs...)...)
		}
		sendRaw(t, a.Addr(), datagrams)
		want := int64((burst + 1) * perBurst * perPacket)
		waitStats(t, a, fmt.Sprintf("burst %d", burst+1), func(g node.GossipStats) bool {
			maxRemembered = max(maxRemembered, g.RememberedResets)
			return g.ResetsReceived >= want
		})
	}
	elapsed := time.Since(start)
	g := gossipOf(a)
	var memAfter runtime.MemStats
	runtime.ReadMemStats(&memAfter)
	t.Logf("%d forged resets applied in %s (%.0f/s); at most %d ids remembered; heap %d KiB before, %d KiB after",
		g.ResetsReceived, elapsed.Round(time.Millisecond), float64(g.ResetsReceived)/elapsed.Seconds(), maxRemembered,
		memBefore.HeapAlloc>>10, memAfter.HeapAlloc>>10)
	if maxRemembered > 4096 || g.RememberedResets > 4096 {
		t.Fatalf("%d reset ids remembered (%d at the end); the bound is 4096", maxRemembered, g.RememberedResets)
	}
	if maxRemembered < 4096 {
		t.Fatalf("at most %d reset ids remembered: the flood did not reach the bound", maxRemembered)
	}
	// Played again, the flood is refused by number.
	sendUDP(t, a.Addr(), attack.GossipPacket(impersonated, seq, time.Now(), attack.ResetMessage(1, "api", "k1")))
	waitStats(t, a, "the replayed packet", func(g node.GossipStats) bool { return g.Replayed >= 1 })
	// The node answers throughout.
	p := node.Policy{Name: "api", Limit: fiveAMinute}
	if res, err := nodes[0].Check(context.Background(), p, "after", 1); err != nil || !res.Allowed {
		t.Fatalf("check after the flood: %+v, %v", res, err)
	}
}

// A node with another key prefix, or another Redis,
// is refused: its join fails on both sides, neither counts the other, and
// the log says what differs.
func TestPeerWithAnotherPrefixOrRedisIsRefused(t *testing.T) {
	fn := newFaultNet()
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ident := func(prefix, store string) func(*cluster.Config) {
		return func(c *cluster.Config) { c.KeyPrefix, c.StoreID = prefix, store }
	}
	a := startMember(t, fn, "a", nil, ident("q", "redis 10.0.0.9:6379/0"))
	b := startMember(t, fn, "b", []string{a.end.addr}, ident("q", "redis 10.0.0.9:6379/0"))
	waitView(t, a, map[string]string{"a": "alive", "b": "alive"}, 2)
	waitView(t, b, map[string]string{"a": "alive", "b": "alive"}, 2)

	for _, tc := range []struct {
		name, prefix, store, why string
	}{
		{"other-prefix", "q:prod", "redis 10.0.0.9:6379/0", "another key prefix"},
		{"other-redis", "q", "redis 10.0.0.8:6379/0", "another Redis"},
	} {
		end := fn.newEnd()
		m, err := cluster.New(cluster.Config{
			NodeName: tc.name, DeadAfter: testDeadAfter, RejoinInterval: time.Hour, Transport: end,
			KeyPrefix: tc.prefix, StoreID: tc.store,
		}, logger)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Shutdown() })
		n, err := m.Join(context.Background(), a.end.addr)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.why)) {
			t.Fatalf("%s joined (%d contacts, %v); want refused for %s", tc.name, n, err, tc.why)
		}
		if m.Size() != 1 || a.Size() != 2 || b.Size() != 2 {
			t.Fatalf("after %s's refused join: sizes %d, %d (a), %d (b)", tc.name, m.Size(), a.Size(), b.Size())
		}
		if m.Stats().Refused == 0 {
			t.Fatalf("%s counted no refusal", tc.name)
		}
		if out := logs.String(); !bytes.Contains([]byte(out), []byte("cluster: refused a peer: it uses "+tc.why)) {
			t.Fatalf("the log does not say why %s was refused:\n%s", tc.name, out)
		}
	}
	waitFor(t, 10*time.Second, func() (bool, string) {
		return a.Stats().Refused > 0, "a counted no refusal"
	})
	if v := view(a.Membership); len(v) != 2 {
		t.Fatalf("a sees [%s]; want only a and b", formatView(v))
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
