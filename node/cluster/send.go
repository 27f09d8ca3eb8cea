package cluster

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/hashicorp/memberlist"
)

// This file is the sender: each round it packs queued messages into
// packets and sends them, to every live member in a cluster of at most
// fanout+1 members, else to fanout random members that relay them
// (spread.go).

// gossipLoop sends queued gossip, at once when something is queued (a
// denial or reset of this node's, or a packet to relay) and again each
// gossip interval while anything is left to send, until ctx ends.
//
// User messages are not relayed by memberlist, so quotad sends its own:
// in a small cluster a node sends each message to every member, twice;
// in a larger one (more peers than the fan-out) each member that takes a
// packet sends it to a few random members for a few rounds, so that a
// member sends O(log n) packets per message instead of n.
func (m *Membership) gossipLoop(ctx context.Context) {
	defer m.loops.Done()
	t := time.NewTicker(m.cfg.gossipInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.gossip.kick:
		}
		m.sendGossip()
	}
}

// sendGossip sends one round of queued gossip: the messages for every
// member to every peer, and each spread packet to fanout random peers.
func (m *Membership) sendGossip() {
	if m.gossip.queued() == 0 {
		return
	}
	now := time.Now()
	direct := m.gossip.nextPackets(now)
	m.gossip.packFresh(now)
	spread := m.gossip.spread.GetBroadcasts(0, maxPacketsPerRound*maxGossipPacket)
	peers := m.peers.Load()
	if peers == nil {
		return
	}
	for _, pkt := range direct {
		for _, p := range *peers {
			m.send(p, pkt)
		}
	}
	for _, pkt := range spread {
		// The packet's sender never needs it back: it would only count
		// it as from an unknown sender.
		origin := m.gossip.senderName(packetSender(pkt))
		for _, p := range pickPeers(*peers, m.fanout(), origin) {
			m.send(p, pkt)
		}
	}
}

// send sends one packet to p, as a memberlist user message over UDP.
func (m *Membership) send(p *memberlist.Node, pkt []byte) {
	if err := m.ml.SendBestEffort(p, pkt); err != nil {
		m.log.Debug("cluster: sending gossip", "to", p.Name, "err", err)
	}
}

// wake tells the sender that something is queued.
func (g *gossip) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// nextPackets takes one round of the messages for every member, freshest
// first, and packs them into packets stamped now, each with the next
// number.
func (g *gossip) nextPackets(now time.Time) [][]byte {
	var packets [][]byte
	for _, msgs := range takeRound(&g.queue) {
		h := packetHeader{sender: g.id, seq: g.seq.Add(1), sentMs: now.UnixMilli()}
		packets = append(packets, appendPacket(nil, h, msgs...))
	}
	return packets
}

// takeRound takes one round of q's messages and groups them into as few
// packets' worth as they fit.
func takeRound(q *roundQueue) [][][]byte {
	// Overhead 2: each message's uvarint length (< 2^14).
	msgs := q.GetBroadcasts(2, maxPacketsPerRound*(maxGossipPacket-packetHeaderLen-2))
	var groups [][][]byte
	for len(msgs) > 0 {
		n, size := 0, packetHeaderLen
		for n < len(msgs) && (n == 0 || size+binary.MaxVarintLen16+len(msgs[n]) <= maxGossipPacket) {
			size += binary.MaxVarintLen16 + len(msgs[n])
			n++
		}
		groups = append(groups, msgs[:n])
		msgs = msgs[n:]
	}
	return groups
}
