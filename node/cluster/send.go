package cluster

import (
	"context"
	"encoding/binary"
	"time"
)

// This file is the sender: each round it packs queued messages into
// packets and sends them to every live member.

// gossipLoop sends queued gossip to every live member, at once when
// something is queued and again one gossip interval later (each message
// goes out gossipTransmits times), until ctx ends.
//
// Unlike memberlist's own state, user messages are not relayed by their
// receivers, so memberlist's piggybacking (a few transmissions to random
// members) would leave some members without the message. Sending each
// batch to every member costs members × packets per round, which is
// small for the tens of nodes a quotad cluster runs; messages are batched
// into as few packets as they fit.
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

// sendGossip sends one round of queued gossip to every peer.
func (m *Membership) sendGossip() {
	if m.gossip.queue.NumQueued() == 0 {
		return
	}
	packets := m.gossip.nextPackets(time.Now())
	peers := m.peers.Load()
	if peers == nil {
		return
	}
	for _, pkt := range packets {
		for _, p := range *peers {
			if err := m.ml.SendBestEffort(p, pkt); err != nil {
				m.log.Debug("cluster: sending gossip", "to", p.Name, "err", err)
			}
		}
	}
}

// wake tells the sender that something is queued.
func (g *gossip) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// nextPackets takes one round of queued messages, freshest first, and
// packs them into packets stamped now, each with the next number.
func (g *gossip) nextPackets(now time.Time) [][]byte {
	// Overhead 2: each message's uvarint length (< 2^14).
	msgs := g.queue.GetBroadcasts(2, maxPacketsPerRound*(maxGossipPacket-packetHeaderLen-2))
	var packets [][]byte
	for len(msgs) > 0 {
		n, size := 0, packetHeaderLen
		for n < len(msgs) && (n == 0 || size+binary.MaxVarintLen16+len(msgs[n]) <= maxGossipPacket) {
			size += binary.MaxVarintLen16 + len(msgs[n])
			n++
		}
		h := packetHeader{sender: g.id, seq: g.seq.Add(1), sentMs: now.UnixMilli()}
		packets = append(packets, appendPacket(make([]byte, 0, size), h, msgs[:n]...))
		msgs = msgs[n:]
	}
	return packets
}
