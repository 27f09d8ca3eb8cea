package cluster

import (
	"bytes"
	"errors"
	"time"

	"github.com/quotad/quotad/node"
)

// This file is the receiving side of the gossip: which packets are taken
// (from members, once, while fresh), and what their messages do.

// receive admits, decodes and applies one packet from a peer and, when
// spreading, queues it to relay (spread.go). It runs on memberlist's
// packet goroutine (and on its stream goroutines for messages sent over
// TCP), so it must not block for long; it takes constant time per
// message, whatever arrives.
func (g *gossip) receive(b []byte, spreading bool) {
	now := time.Now()
	h, msgs, err := splitPacket(b)
	if err != nil {
		if errors.Is(err, errUnsupportedGossip) {
			g.unsupported.Add(1)
		} else {
			g.malformed.Add(1)
		}
		g.log.Debug("cluster: dropped a gossip packet", "bytes", len(b), "err", err)
		return
	}
	if !g.admit(h, now) {
		return
	}
	// How much older the packet is than its arrival says: a denial holds
	// that much less.
	age := max(0, now.Sub(time.UnixMilli(h.sentMs)))
	// A packet longer than this node would send is applied but not
	// relayed: only a forger builds one.
	var relay *spreadPacket
	if spreading && len(b) <= maxGossipPacket {
		relay = &spreadPacket{g: g, sender: h.sender, seq: h.seq}
	}
	for _, msg := range msgs {
		g.receiveOne(msg, now, age, relay)
	}
	if relay != nil {
		g.queueSpread(relay)
	}
}

// admit reports whether a packet with header h, arriving at now, is to be
// applied: from a current member, not older or newer than maxAge on this
// node's clock, and not taken before. Each check that fails is counted.
func (g *gossip) admit(h packetHeader, now time.Time) bool {
	senders := g.senders.Load()
	if senders == nil {
		g.unknownSender.Add(1)
		return false
	}
	name, ok := (*senders)[h.sender]
	if !ok {
		g.unknownSender.Add(1)
		return false
	}
	if skew := now.Sub(time.UnixMilli(h.sentMs)); skew > g.maxAge || skew < -g.maxAge {
		g.stale.Add(1)
		g.warnStale(name, skew, now)
		return false
	}
	g.mu.Lock()
	w := g.windows[h.sender]
	if w == nil {
		w = &replayWindow{}
		g.windows[h.sender] = w
	}
	fresh := w.take(h.seq)
	g.mu.Unlock()
	if !fresh {
		g.replayed.Add(1)
	}
	return fresh
}

// warnStale says, at most every staleWarnEvery, that a member's gossip
// arrives too old or too new to be taken: the clock of the member that
// sent or relayed it and this node's disagree (or someone plays old
// packets).
func (g *gossip) warnStale(member string, skew time.Duration, now time.Time) {
	last := g.lastStaleWarn.Load()
	if now.UnixNano()-last < int64(staleWarnEvery) || !g.lastStaleWarn.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	g.log.Warn("cluster: dropping gossip sent too long before (or after) it arrived; are the members' clocks apart?",
		"member", member, "age", skew.Round(time.Millisecond), "max_age", g.maxAge)
}

// receiveOne decodes and applies one message of a packet that arrived at
// now and is age older than it looks, and adds it, as applied, to relay
// unless relay is nil. A denial too short to be worth a packet is not
// relayed.
func (g *gossip) receiveOne(b []byte, now time.Time, age time.Duration, relay *spreadPacket) {
	m, err := decodeGossip(b)
	if err != nil {
		g.malformed.Add(1)
		g.log.Debug("cluster: dropped a gossip message", "bytes", len(b), "err", err)
		return
	}
	r := g.recv.Load()
	switch m.kind {
	case kindDenial:
		d := m.denial
		d.retryAfter = max(0, d.retryAfter-age)
		d.resetAfter = max(0, d.resetAfter-age)
		if capDenial(&d) {
			g.capped.Add(1)
			g.log.Debug("cluster: capped a gossiped denial longer than its limit allows", "policy", d.policy, "key", d.key,
				"retry_after", m.denial.retryAfter, "reset_after", m.denial.resetAfter)
		}
		if r != nil {
			r.ApplyDenial(node.Denial{
				Policy: d.policy, Key: d.key, Limit: d.limit, Cost: d.cost,
				RetryAfter: d.retryAfter, ResetAfter: d.resetAfter, Remaining: d.remaining, At: now,
			})
		}
		g.denialsReceived.Add(1)
		if relay != nil && d.retryAfter >= g.minDenial {
			relay.addDenial(d, now)
		}
	case kindReset:
		if relay != nil {
			// Even a reset already applied here: the members this node
			// relays to may not have it.
			relay.resets = append(relay.resets, bytes.Clone(b))
		}
		if !g.firstSight(m.reset.id) {
			g.duplicateResets.Add(1)
			return
		}
		// A denial this node queued before the reset reached it is stale
		// too.
		g.cancelDenial(m.reset.policy, m.reset.key)
		if r != nil {
			r.ApplyReset(m.reset.policy, m.reset.key)
		}
		g.resetsReceived.Add(1)
	}
}

// capDenial holds d's waits to what its limit can justify and reports
// whether they were longer. A node holds a lease at most MaxFraction (at
// most all) of the period, which bounds the sliding log's wait.
func capDenial(d *denialMsg) bool {
	hold := d.limit.Period
	maxRetry, maxReset := d.limit.MaxRetryAfter(d.cost, hold), d.limit.MaxResetAfter(hold)
	if d.retryAfter <= maxRetry && d.resetAfter <= maxReset {
		return false
	}
	d.retryAfter, d.resetAfter = min(d.retryAfter, maxRetry), min(d.resetAfter, maxReset)
	return true
}

// firstSight records a reset id and reports whether it is new.
func (g *gossip) firstSight(id uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resets.add(id, time.Now())
}
