package cluster

import (
	"fmt"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// spreadingGossip is the gossip of a member of a cluster of n that takes
// packets from sender 7 ("b").
func spreadingGossip(n int) *gossip {
	g := newGossip(slog.New(slog.DiscardHandler), 1, DefaultGossipMaxAge)
	g.spreadIn(func() int { return n }, 100*time.Millisecond)
	g.setSenders(map[uint64]string{7: "b"}, time.Now())
	return g
}

// takeSpread takes one round of g's spread packets and decodes them.
func takeSpread(t *testing.T, g *gossip) []packetHeader {
	t.Helper()
	var hs []packetHeader
	for _, pkt := range g.spread.GetBroadcasts(0, maxPacketsPerRound*maxGossipPacket) {
		h, _, err := splitPacket(pkt)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	return hs
}

// spreadDenial decodes the first denial of the next spread packet.
func spreadDenial(t *testing.T, g *gossip) (packetHeader, denialMsg) {
	t.Helper()
	pkts := g.spread.GetBroadcasts(0, maxPacketsPerRound*maxGossipPacket)
	if len(pkts) != 1 {
		t.Fatalf("%d packets to spread; want 1", len(pkts))
	}
	h, msgs, err := splitPacket(pkts[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range msgs {
		if m, err := decodeGossip(b); err == nil && m.kind == kindDenial {
			return h, m.denial
		}
	}
	t.Fatalf("no denial in %x", pkts[0])
	return h, denialMsg{}
}

// A spreading member relays a packet it takes under its origin's sender id
// and number, stamped with its own clock, its denial holding what is left
// of it: the packet's age on arrival and the time it waited are taken off.
// It goes out spreadRounds times, then the queue forgets it.
func TestRelayKeepsTheOriginAndCountsDown(t *testing.T) {
	g := spreadingGossip(30)
	sent := time.Now().Add(-200 * time.Millisecond)
	g.receive(appendPacket(nil, packetHeader{sender: 7, seq: 3, sentMs: sent.UnixMilli()}, appendDenial(nil, sampleDenial)), true)
	time.Sleep(100 * time.Millisecond)
	before := time.Now()
	h, d := spreadDenial(t, g)
	if h.sender != 7 || h.seq != 3 || h.sentMs < before.UnixMilli() || h.sentMs > time.Now().UnixMilli() {
		t.Fatalf("relayed header %+v; want sender 7, seq 3, sent as it left (%d)", h, before.UnixMilli())
	}
	// 1.5s less 200ms of age and 100ms of waiting, whole milliseconds.
	if d.retryAfter > 1200*time.Millisecond || d.retryAfter < 1100*time.Millisecond || d.retryAfter%time.Millisecond != 0 {
		t.Fatalf("relayed retry_after %s; want at most 1.2s, in whole milliseconds", d.retryAfter)
	}
	rounds := 1
	for len(takeSpread(t, g)) > 0 {
		rounds++
	}
	if rounds != spreadRounds(30) || spreadRounds(30) != 4 {
		t.Fatalf("relayed %d rounds; want spreadRounds(30) = %d = 4", rounds, spreadRounds(30))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pending) != 0 {
		t.Fatalf("%d keys still pending once the packet is done", len(g.pending))
	}
}

// A reset that arrives after a denial of its key was queued to relay makes
// that denial go out as already over, and is relayed itself.
func TestResetCancelsARelayedDenial(t *testing.T) {
	g := spreadingGossip(30)
	now := time.Now()
	g.receive(appendPacket(nil, packetHeader{sender: 7, seq: 1, sentMs: now.UnixMilli()}, appendDenial(nil, sampleDenial)), true)
	if _, d := spreadDenial(t, g); d.retryAfter < time.Second {
		t.Fatalf("before the reset the relayed denial holds %s", d.retryAfter)
	}
	g.receive(appendPacket(nil, packetHeader{sender: 7, seq: 2, sentMs: now.UnixMilli()}, appendReset(nil, sampleReset)), true)
	resets := 0
	for _, pkt := range g.spread.GetBroadcasts(0, maxPacketsPerRound*maxGossipPacket) {
		_, msgs, err := splitPacket(pkt)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range msgs {
			m, err := decodeGossip(b)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case m.kind == kindReset:
				resets++
			case m.denial.retryAfter != 0:
				t.Fatalf("after the reset the relayed denial goes out holding %s", m.denial.retryAfter)
			}
		}
	}
	if resets != 1 {
		t.Fatalf("the reset went out %d times in a round; want 1", resets)
	}
}

// What is not relayed: anything by a member that is not spreading, a
// packet taken before, a denial too short to be worth a packet (the
// packet then has nothing to relay), and a packet longer than a member
// sends.
func TestWhatIsNotRelayed(t *testing.T) {
	g := spreadingGossip(30)
	now := time.Now()
	pkt := func(seq uint64, msgs ...[]byte) []byte {
		return appendPacket(nil, packetHeader{sender: 7, seq: seq, sentMs: now.UnixMilli()}, msgs...)
	}
	short := sampleDenial
	short.retryAfter = 50 * time.Millisecond
	long := sampleDenial
	long.key = fmt.Sprintf("%0990d", 0)
	cases := []struct {
		name      string
		pkt       []byte
		spreading bool
	}{
		{"not spreading", pkt(1, appendDenial(nil, sampleDenial)), false},
		{"taken before", pkt(1, appendDenial(nil, sampleDenial)), true},
		{"too short", pkt(2, appendDenial(nil, short)), true},
		{"too long", pkt(3, appendDenial(nil, long), appendDenial(nil, long)), true},
	}
	for _, tc := range cases {
		g.receive(tc.pkt, tc.spreading)
		if n := g.spread.NumQueued(); n != 0 {
			t.Fatalf("%s: %d packets queued to relay", tc.name, n)
		}
	}
	if got := g.denialsReceived.Load(); got != 4 {
		t.Fatalf("%d denials applied; want 4 (all but the packet taken before)", got)
	}
}

// A spreading member's own messages leave once, packed into packets of its
// own that then go out spreadRounds times; a member that is not spreading
// sends its own to every member gossipTransmits times.
func TestOwnMessagesLeaveOnceWhenSpreading(t *testing.T) {
	g := spreadingGossip(100)
	d := sampleDenial
	d.retryAfter = time.Hour
	g.queueDenial(d, time.Now(), true)
	g.queueReset("api", "other", true)
	if n := g.queue.NumQueued(); n != 0 {
		t.Fatalf("%d messages queued for every member while spreading", n)
	}
	g.packFresh(time.Now())
	if n := g.fresh.NumQueued(); n != 0 {
		t.Fatalf("%d fresh messages left after packing them once", n)
	}
	rounds := 0
	for {
		hs := takeSpread(t, g)
		if len(hs) == 0 {
			break
		}
		if len(hs) != 1 || hs[0].sender != 1 || hs[0].seq != 1 {
			t.Fatalf("round %d: %+v; want this member's packet 1", rounds+1, hs)
		}
		rounds++
	}
	if rounds != spreadRounds(100) || spreadRounds(100) != 6 {
		t.Fatalf("%d rounds; want spreadRounds(100) = %d = 6", rounds, spreadRounds(100))
	}
	g.queueDenial(d, time.Now(), false)
	if g.queue.NumQueued() != 1 || g.fresh.NumQueued() != 0 {
		t.Fatalf("not spreading: %d queued for every member, %d fresh; want 1 and 0", g.queue.NumQueued(), g.fresh.NumQueued())
	}
}

// spreadRounds grows as log10 of the cluster: with the fan-out, what one
// member sends per message grows from 6 to 12 to 18 as the cluster grows
// tenfold, where sending to every member grows as the cluster.
func TestSpreadRoundsGrowLogarithmically(t *testing.T) {
	for _, tc := range []struct{ n, rounds int }{{1, 2}, {9, 2}, {10, 4}, {30, 4}, {99, 4}, {100, 6}, {999, 6}, {1000, 8}} {
		if got := spreadRounds(tc.n); got != tc.rounds {
			t.Errorf("spreadRounds(%d) = %d; want %d", tc.n, got, tc.rounds)
		}
		if want := gossipTransmits * int(math.Ceil(math.Log10(float64(tc.n+1)))); spreadRounds(tc.n) != want {
			t.Errorf("spreadRounds(%d) is not memberlist's retransmit limit %d", tc.n, want)
		}
	}
}

// pickPeers draws k distinct peers, never the one to skip, and all of them
// when there are no more than k.
func TestPickPeers(t *testing.T) {
	var peers []*memberlist.Node
	for i := range 10 {
		peers = append(peers, &memberlist.Node{Name: fmt.Sprint(i)})
	}
	seen := map[string]int{}
	for range 1000 {
		got := pickPeers(peers, 3, "4")
		if len(got) != 3 {
			t.Fatalf("%d peers; want 3", len(got))
		}
		distinct := map[string]bool{}
		for _, p := range got {
			if p.Name == "4" || distinct[p.Name] {
				t.Fatalf("drew %v: the skipped peer, or one twice", got)
			}
			distinct[p.Name] = true
			seen[p.Name]++
		}
	}
	// 3000 draws over 9 peers: about 333 each.
	for name, n := range seen {
		if n < 200 || n > 470 {
			t.Errorf("peer %s drawn %d times of 3000; want about 333", name, n)
		}
	}
	if len(seen) != 9 {
		t.Fatalf("drew %d distinct peers; want all 9 but the skipped one", len(seen))
	}
	if got := pickPeers(peers[:3], 3, "none"); len(got) != 3 {
		t.Fatalf("3 peers, fan-out 3: %d drawn; want all 3", len(got))
	}
	if got := pickPeers(peers[:4], 3, "0"); len(got) != 3 {
		t.Fatalf("4 peers but one skipped, fan-out 3: %d drawn; want the other 3", len(got))
	}
}
