package cluster

import (
	"math/rand/v2"
	"net"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/quotad/quotad/node"
)

// This file is the member table: memberlist's join, update and leave
// events, the live members' count, and the peers and senders the gossip
// uses.

// events records membership changes. memberlist calls it with its own
// locks held and never concurrently, so it only updates this node's table.
type events struct{ m *Membership }

func (e events) NotifyJoin(n *memberlist.Node)   { e.m.record(n, node.MemberAlive) }
func (e events) NotifyUpdate(n *memberlist.Node) { e.m.record(n, node.MemberAlive) }
func (e events) NotifyLeave(n *memberlist.Node) {
	state := node.MemberDead
	if metaLeaving(n.Meta) {
		state = node.MemberLeft
	}
	e.m.record(n, state)
}

func (m *Membership) record(n *memberlist.Node, state node.MemberState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, known := m.members[n.Name]
	since := time.Now()
	if known && old.State == state {
		since = old.Since
	}
	self := n.Name == m.name
	m.members[n.Name] = node.Member{Name: n.Name, Addr: n.Address(), State: state, Self: self, Since: since}
	if meta, ok := decodeMeta(n.Meta); ok {
		m.gossipIDs[n.Name] = meta.gossipID
	}
	if !self {
		m.updatePeer(n, state == node.MemberAlive)
		m.updateSenders()
	}
	live := 0
	for _, mb := range m.members {
		if mb.State == node.MemberAlive {
			live++
		}
	}
	m.size.Store(int64(live))
	if !self && (!known || old.State != state) {
		m.log.Info("cluster: member "+state.String(), "member", n.Name, "addr", n.Address(), "members", live)
	}
}

// updateSenders tells the gossip the gossip ids of the live members but
// this node: the only senders it takes packets from. Called with m.mu
// held.
func (m *Membership) updateSenders() {
	senders := make(map[uint64]string)
	for name, mb := range m.members {
		if id, ok := m.gossipIDs[name]; ok && mb.State == node.MemberAlive && !mb.Self {
			senders[id] = name
		}
	}
	m.gossip.setSenders(senders, time.Now())
}

// newGossipID returns a random, non-zero gossip id for this process.
func newGossipID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// updatePeer adds n to the gossip sender's peers, or removes it. The
// copy is taken here, under memberlist's lock: the Node it passes is
// memberlist's own, which it rewrites later. Called with m.mu held.
func (m *Membership) updatePeer(n *memberlist.Node, alive bool) {
	var peers []*memberlist.Node
	if old := m.peers.Load(); old != nil {
		for _, p := range *old {
			if p.Name != n.Name {
				peers = append(peers, p)
			}
		}
	}
	if alive {
		peers = append(peers, &memberlist.Node{Name: n.Name, Addr: append(net.IP(nil), n.Addr...), Port: n.Port, PMin: n.PMin, PMax: n.PMax, PCur: n.PCur})
	}
	m.peers.Store(&peers)
}
