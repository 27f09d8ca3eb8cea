package cluster

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/memberlist"
)

// This file is the spread of gossip in a cluster of more than
// gossipFanout+1 members: a packet goes to gossipFanout random members in
// each of spreadRounds rounds, and every member that takes it does the
// same, so that each member sends O(log n) packets per message, not n.
//
// A relayed packet keeps its origin's sender id and number: the receiver's
// replay window (replay.go), which takes a packet once, is also what
// stops a packet that has already been relayed to a member from being
// taken and relayed by it again. Its messages are re-encoded as of each
// transmission and it is stamped with the relaying member's clock, so a
// denial counts down across hops exactly as across one: each hop carries
// the time the denial still holds when it leaves.

const (
	// gossipFanout is how many random members a spread packet goes to
	// each round. A cluster with at most this many peers sends every
	// message to every member instead (send.go), which costs a node no
	// more packets and reaches everyone in one hop.
	gossipFanout = 3
	// maxSpreadPackets bounds the packets waiting to be spread; beyond it
	// the oldest are dropped (and counted), which only costs other nodes
	// store calls.
	maxSpreadPackets = 1024
)

// spreadRounds is how many rounds a spread packet goes out in a cluster of
// n live members: gossipTransmits × ceil(log10(n+1)), memberlist's rule
// for its own broadcasts (2 up to 9 members, 4 up to 99, 6 up to 999).
// With gossipFanout, a member sends a packet gossipFanout × spreadRounds
// times: 12 at 30 members, 18 at 100.
// It is the transmit limit the queue applies (memberlist does not export
// its own function).
func spreadRounds(n int) int {
	return gossipTransmits * int(math.Ceil(math.Log10(float64(n+1))))
}

// spreadQueue is memberlist's TransmitLimitedQueue of packets to spread:
// it hands each packet out spreadRounds(n) times, n the live members when
// it does.
type spreadQueue struct {
	memberlist.TransmitLimitedQueue
}

// init makes q hand each packet out spreadRounds(size()) times.
func (q *spreadQueue) init(size func() int) {
	q.NumNodes = size
	q.RetransmitMult = gossipTransmits
}

// spreadPacket is a packet to spread, this node's or a member's to relay:
// its origin's sender id and number, and its messages, which are
// re-encoded for each transmission.
type spreadPacket struct {
	g           *gossip
	sender, seq uint64
	denials     []*denialBroadcast
	resets      [][]byte
}

var _ memberlist.UniqueBroadcast = (*spreadPacket)(nil)

func (p *spreadPacket) UniqueBroadcast()                      {}
func (p *spreadPacket) Invalidates(memberlist.Broadcast) bool { return false }

// Message encodes the packet as of now: its denials' waits as they stand
// (cancelled ones expired), stamped with this node's clock. It only gets
// shorter over time, as memberlist's queue requires.
func (p *spreadPacket) Message() []byte {
	msgs := make([][]byte, 0, len(p.denials)+len(p.resets))
	for _, d := range p.denials {
		msgs = append(msgs, d.Message())
	}
	msgs = append(msgs, p.resets...)
	return appendPacket(nil, packetHeader{sender: p.sender, seq: p.seq, sentMs: time.Now().UnixMilli()}, msgs...)
}

// Finished forgets the packet's denials once memberlist is done with it.
func (p *spreadPacket) Finished() {
	for _, d := range p.denials {
		p.g.untrack(d)
	}
}

// addDenial adds d, whose durations hold as of at, to the packet, where a
// reset of its key can cancel it.
func (p *spreadPacket) addDenial(d denialMsg, at time.Time) {
	b := &denialBroadcast{g: p.g, msg: d, at: at, name: "d" + keyName(d.policy, d.key)}
	p.g.track(b)
	p.denials = append(p.denials, b)
}

// packFresh takes this node's messages queued while spreading, once, and
// queues them as packets of its own to spread.
func (g *gossip) packFresh(now time.Time) {
	for _, msgs := range takeRound(&g.fresh) {
		p := &spreadPacket{g: g, sender: g.id, seq: g.seq.Add(1)}
		for _, b := range msgs {
			m, err := decodeGossip(b)
			if err != nil { // encoded here: cannot happen
				g.malformed.Add(1)
				continue
			}
			switch m.kind {
			case kindDenial:
				p.addDenial(m.denial, now)
			case kindReset:
				p.resets = append(p.resets, bytes.Clone(b))
			}
		}
		g.queueSpread(p)
	}
}

// queueSpread queues p to spread, dropping the oldest packets beyond
// maxSpreadPackets, and wakes the sender.
func (g *gossip) queueSpread(p *spreadPacket) {
	if len(p.denials)+len(p.resets) == 0 {
		return
	}
	g.spread.QueueBroadcast(p)
	if n := g.spread.NumQueued(); n > maxSpreadPackets {
		g.spread.Prune(maxSpreadPackets)
		g.dropped.Add(int64(n - maxSpreadPackets))
	}
	g.wake()
}

// packetSender reads the sender id of a packet this node encoded.
func packetSender(pkt []byte) uint64 { return binary.BigEndian.Uint64(pkt[1:9]) }

// senderName is the name of the member whose gossip id is id, or "".
func (g *gossip) senderName(id uint64) string {
	if s := g.senders.Load(); s != nil {
		return (*s)[id]
	}
	return ""
}

// fanout is how many members a spread packet goes to each round:
// gossipFanout, or what a test set.
func (m *Membership) fanout() int { return int(m.spreadFanout.Load()) }

// spreading reports whether this node spreads its gossip through relays:
// whether it has more peers than the fan-out.
func (m *Membership) spreading() bool {
	peers := m.peers.Load()
	return peers != nil && len(*peers) > m.fanout()
}

// pickPeers returns up to k distinct random peers but the one named
// skip; all of them when there are no more than k.
func pickPeers(peers []*memberlist.Node, k int, skip string) []*memberlist.Node {
	eligible := make([]*memberlist.Node, 0, len(peers))
	for _, p := range peers {
		if p.Name != skip {
			eligible = append(eligible, p)
		}
	}
	if len(eligible) <= k {
		return eligible
	}
	// A partial Fisher-Yates shuffle: the first k are a uniform sample.
	for i := range k {
		j := i + rand.IntN(len(eligible)-i)
		eligible[i], eligible[j] = eligible[j], eligible[i]
	}
	return eligible[:k]
}
