package node

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

const (
	// gossipTransmits is how many times each message goes to each member,
	// one gossip interval apart: a packet lost once still arrives.
	gossipTransmits = 2
	// maxPacketsPerRound bounds what one round sends to each member; the
	// rest waits for the next round.
	maxPacketsPerRound = 8
	// maxQueuedGossip bounds the broadcasts waiting to go out; beyond it
	// the oldest are dropped. Each is one key's denial or reset, and a
	// dropped one only costs another node a store call.
	maxQueuedGossip = 4096
	// staleWarnEvery is how often at most the log says that gossip arrives
	// too old (clocks apart).
	staleWarnEvery = time.Minute
)

// GossipStats counts a node's gossip. Counts are totals since the
// membership started.
type GossipStats struct {
	// DenialsSent and ResetsSent count messages queued for the cluster;
	// DenialsReceived and ResetsReceived those received from peers, each
	// counted once applied.
	DenialsSent, ResetsSent, DenialsReceived, ResetsReceived int64
	// DuplicateResets counts retransmitted resets ignored because their id
	// was already applied.
	DuplicateResets int64
	// Capped counts received denials whose retry_after or reset_after
	// exceeded what their limit can justify (Limit.MaxRetryAfter, with
	// leases held at most one period) and were cut to it: a sign of a
	// forged message, since no store says more.
	Capped int64
	// Malformed counts packets and messages dropped because they did not
	// decode or validate; Unsupported packets of a version this node does
	// not speak.
	Malformed, Unsupported int64
	// UnknownSender counts packets dropped because their sender is not a
	// current member (never joined, refused, or a past incarnation);
	// Replayed those whose number this node had already taken from that
	// sender, or that came too far behind its newer ones; Stale those sent
	// more than GossipMaxAge before, or after, this node's clock.
	UnknownSender, Replayed, Stale int64
	// TooLarge counts denials and resets not gossiped because their
	// encoding would exceed one packet; Dropped those pruned from a full
	// queue.
	TooLarge, Dropped int64
	// Queued is the number of broadcasts waiting to go out.
	Queued int
	// RememberedResets is the number of reset ids remembered to ignore
	// retransmissions; at most 4096.
	RememberedResets int
}

// gossip is the membership's half of the denial and reset gossip: the
// outgoing queue, and the admission and decoding of incoming packets,
// whose messages it hands to the node it serves.
type gossip struct {
	queue memberlist.TransmitLimitedQueue
	log   *slog.Logger
	// id is this process's gossip id, the sender of its packets; seq
	// numbers them.
	id  uint64
	seq atomic.Uint64
	// maxAge is MembershipConfig.GossipMaxAge.
	maxAge time.Duration
	// recv is the node that applies received messages; nil until a node
	// attaches (messages are dropped meanwhile).
	recv atomic.Pointer[Node]
	// senders are the gossip ids of the live members but this one, with
	// their names; packets from any other id are dropped.
	senders atomic.Pointer[map[uint64]string]
	// kick wakes the sender when something is queued.
	kick chan struct{}
	// lastStaleWarn is when the log last said that gossip arrives stale
	// (Unix ns).
	lastStaleWarn atomic.Int64

	mu sync.Mutex
	// pending are the queued denials by key, so that a reset can cancel
	// the denial it makes stale.
	pending map[string]*denialBroadcast
	// windows are the packet numbers taken from each sender, members and
	// recently departed ones.
	windows map[uint64]*replayWindow
	// resets are recently applied reset ids.
	resets recentIDs

	denialsSent, resetsSent, denialsReceived, resetsReceived atomic.Int64
	duplicateResets, capped, malformed, unsupported          atomic.Int64
	unknownSender, replayed, stale, tooLarge, dropped        atomic.Int64
}

// newGossip returns the gossip of a process whose packets go out as
// sender id and are taken only within maxAge of their sending.
func newGossip(log *slog.Logger, id uint64, maxAge time.Duration) *gossip {
	g := &gossip{
		log: log, id: id, maxAge: maxAge, kick: make(chan struct{}, 1),
		pending: make(map[string]*denialBroadcast), windows: make(map[uint64]*replayWindow),
	}
	// The queue sends a message RetransmitMult × ceil(log10(NumNodes+1))
	// times; with NumNodes 1 that is gossipTransmits rounds, each to every
	// member, whatever the cluster's size.
	g.queue.NumNodes = func() int { return 1 }
	g.queue.RetransmitMult = gossipTransmits
	return g
}

// setSenders replaces the gossip ids packets are taken from: those of the
// live members but this one. The replay windows of senders that left are
// kept for twice the maximum age, so that one coming back meanwhile (a
// member declared dead that refutes it) cannot have its packets played
// again, and then dropped: by then any packet they covered is stale.
func (g *gossip) setSenders(senders map[uint64]string, now time.Time) {
	g.senders.Store(&senders)
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, w := range g.windows {
		switch _, member := senders[id]; {
		case member:
			w.goneAt = time.Time{}
		case w.goneAt.IsZero():
			w.goneAt = now
		case now.Sub(w.goneAt) > 2*g.maxAge:
			delete(g.windows, id)
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

func (g *gossip) stats() GossipStats {
	return GossipStats{
		DenialsSent: g.denialsSent.Load(), ResetsSent: g.resetsSent.Load(),
		DenialsReceived: g.denialsReceived.Load(), ResetsReceived: g.resetsReceived.Load(),
		DuplicateResets: g.duplicateResets.Load(), Capped: g.capped.Load(),
		Malformed: g.malformed.Load(), Unsupported: g.unsupported.Load(),
		UnknownSender: g.unknownSender.Load(), Replayed: g.replayed.Load(), Stale: g.stale.Load(),
		TooLarge: g.tooLarge.Load(), Dropped: g.dropped.Load(),
		Queued: g.queue.NumQueued(), RememberedResets: g.rememberedResets(),
	}
}

func (g *gossip) rememberedResets() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resets.len()
}

// keyName identifies a key in the queue; policy names cannot hold NUL.
func keyName(policy, key string) string { return policy + "\x00" + key }

// queueDenial broadcasts m, whose durations were measured at at (a time
// with a monotonic reading). A newer denial of the same key replaces one
// still queued.
func (g *gossip) queueDenial(m denialMsg, at time.Time) {
	b := &denialBroadcast{msg: m, at: at, name: "d" + keyName(m.policy, m.key), g: g}
	if len(b.Message()) > maxGossipMessage {
		g.tooLarge.Add(1)
		return
	}
	g.mu.Lock()
	g.pending[keyName(m.policy, m.key)] = b
	g.mu.Unlock()
	g.queue.QueueBroadcast(b)
	g.denialsSent.Add(1)
	g.prune()
	g.wake()
}

// queueReset broadcasts that key was reset, cancelling a queued denial of
// it: that denial predates the reset.
func (g *gossip) queueReset(policy, key string) {
	msg := appendReset(nil, resetMsg{id: rand.Uint64(), policy: policy, key: key})
	if len(msg) > maxGossipMessage {
		g.tooLarge.Add(1)
		return
	}
	g.cancelDenial(policy, key)
	g.queue.QueueBroadcast(&resetBroadcast{msg: msg, name: "r" + keyName(policy, key)})
	g.resetsSent.Add(1)
	g.prune()
	g.wake()
}

func (g *gossip) prune() {
	if n := g.queue.NumQueued(); n > maxQueuedGossip {
		g.queue.Prune(maxQueuedGossip)
		g.dropped.Add(int64(n - maxQueuedGossip))
	}
}

// cancelDenial makes a queued denial of key go out as already expired
// from now on (memberlist has no way to withdraw a queued broadcast).
func (g *gossip) cancelDenial(policy, key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if b := g.pending[keyName(policy, key)]; b != nil {
		b.cancelled.Store(true)
	}
}

// receive admits, decodes and applies one packet from a peer. It runs on
// memberlist's packet goroutine (and on its stream goroutines for
// messages sent over TCP), so it must not block for long; it takes
// constant time per message, whatever arrives.
func (g *gossip) receive(b []byte) {
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
	for _, msg := range msgs {
		g.receiveOne(msg, age)
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
// arrives too old or too new to be taken: its clock and this node's
// disagree (or someone plays old packets).
func (g *gossip) warnStale(member string, skew time.Duration, now time.Time) {
	last := g.lastStaleWarn.Load()
	if now.UnixNano()-last < int64(staleWarnEvery) || !g.lastStaleWarn.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	g.log.Warn("cluster: dropping gossip sent too long before (or after) it arrived; are the members' clocks apart?",
		"member", member, "age", skew.Round(time.Millisecond), "max_age", g.maxAge)
}

// receiveOne decodes and applies one message of a packet that is age
// older than it looks.
func (g *gossip) receiveOne(b []byte, age time.Duration) {
	m, err := decodeGossip(b)
	if err != nil {
		g.malformed.Add(1)
		g.log.Debug("cluster: dropped a gossip message", "bytes", len(b), "err", err)
		return
	}
	n := g.recv.Load()
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
		if n != nil {
			n.applyDenial(d)
		}
		g.denialsReceived.Add(1)
	case kindReset:
		if !g.firstSight(m.reset.id) {
			g.duplicateResets.Add(1)
			return
		}
		// A denial this node queued before the reset reached it is stale
		// too.
		g.cancelDenial(m.reset.policy, m.reset.key)
		if n != nil {
			n.applyReset(m.reset.policy, m.reset.key)
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

// denialBroadcast is a queued denial. Its message is rebuilt on every
// transmission so that the time left is current when it leaves.
type denialBroadcast struct {
	g         *gossip
	msg       denialMsg
	at        time.Time
	name      string
	cancelled atomic.Bool
}

var _ memberlist.NamedBroadcast = (*denialBroadcast)(nil)

func (b *denialBroadcast) Name() string { return b.name }

func (b *denialBroadcast) Invalidates(o memberlist.Broadcast) bool {
	nb, ok := o.(memberlist.NamedBroadcast)
	return ok && nb.Name() == b.name
}

// Message encodes the denial as of now: its waits shrink by the time
// since at, and a cancelled or expired one goes out with retry_after 0,
// which receivers do not install. The encoding only gets shorter over
// time, as memberlist's queue requires.
func (b *denialBroadcast) Message() []byte {
	m := b.msg
	elapsed := time.Since(b.at)
	if b.cancelled.Load() {
		elapsed = m.retryAfter
	}
	m.retryAfter = max(0, m.retryAfter-elapsed)
	m.resetAfter = max(m.retryAfter, m.resetAfter-elapsed)
	return appendDenial(make([]byte, 0, 32+len(m.policy)+len(m.key)), m)
}

// Finished forgets the broadcast once memberlist is done with it.
func (b *denialBroadcast) Finished() {
	b.g.mu.Lock()
	defer b.g.mu.Unlock()
	if k := keyName(b.msg.policy, b.msg.key); b.g.pending[k] == b {
		delete(b.g.pending, k)
	}
}

// resetBroadcast is a queued reset; a newer reset of the key replaces it.
type resetBroadcast struct {
	msg  []byte
	name string
}

var _ memberlist.NamedBroadcast = (*resetBroadcast)(nil)

func (b *resetBroadcast) Name() string    { return b.name }
func (b *resetBroadcast) Message() []byte { return b.msg }
func (b *resetBroadcast) Finished()       {}

func (b *resetBroadcast) Invalidates(o memberlist.Broadcast) bool {
	nb, ok := o.(memberlist.NamedBroadcast)
	return ok && nb.Name() == b.name
}

// delegate plugs the membership into memberlist: metadata and incoming
// gossip. memberlist calls it concurrently; none of it blocks.
type delegate struct{ m *Membership }

func (d delegate) NodeMeta(int) []byte { return d.m.meta() }
func (d delegate) NotifyMsg(b []byte)  { d.m.gossip.receive(b) }

// GetBroadcasts offers nothing to piggyback: gossipLoop sends to every
// member itself.
func (d delegate) GetBroadcasts(int, int) [][]byte { return nil }

// LocalState and MergeRemoteState carry nothing: denials and resets are
// short-lived, and a node that missed one only makes a store call (a
// missed reset leaves its leases and cached denials to expire).
func (d delegate) LocalState(bool) []byte            { return nil }
func (d delegate) MergeRemoteState(_ []byte, _ bool) {}
