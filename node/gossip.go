package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
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
	// Malformed counts messages dropped because they did not decode or
	// validate; Unsupported those of a version this node does not speak.
	Malformed, Unsupported int64
	// TooLarge counts denials and resets not gossiped because their
	// encoding would exceed one packet; Dropped those pruned from a full
	// queue.
	TooLarge, Dropped int64
	// Queued is the number of broadcasts waiting to go out.
	Queued int
}

// gossip is the membership's half of the denial and reset gossip: the
// outgoing queue and the decoding of incoming messages, which it hands to
// the node it serves.
type gossip struct {
	queue memberlist.TransmitLimitedQueue
	log   *slog.Logger
	// recv is the node that applies received messages; nil until a node
	// attaches (messages are dropped meanwhile).
	recv atomic.Pointer[Node]
	// kick wakes the sender when something is queued.
	kick chan struct{}

	mu sync.Mutex
	// pending are the queued denials by key, so that a reset can cancel
	// the denial it makes stale.
	pending map[string]*denialBroadcast
	// seen are recently applied reset ids and when they came.
	seen map[uint64]time.Time

	denialsSent, resetsSent, denialsReceived, resetsReceived atomic.Int64
	duplicateResets, malformed, unsupported, tooLarge        atomic.Int64
	dropped                                                  atomic.Int64
}

func newGossip(log *slog.Logger) *gossip {
	g := &gossip{log: log, kick: make(chan struct{}, 1), pending: make(map[string]*denialBroadcast), seen: make(map[uint64]time.Time)}
	// The queue sends a message RetransmitMult × ceil(log10(NumNodes+1))
	// times; with NumNodes 1 that is gossipTransmits rounds, each to every
	// member, whatever the cluster's size.
	g.queue.NumNodes = func() int { return 1 }
	g.queue.RetransmitMult = gossipTransmits
	return g
}

// wake tells the sender that something is queued.
func (g *gossip) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// nextPackets takes one round of queued messages, freshest first, and
// packs them into batch packets.
func (g *gossip) nextPackets() [][]byte {
	// Overhead 2: each message's uvarint length (< 2^14).
	msgs := g.queue.GetBroadcasts(2, maxPacketsPerRound*(maxGossipPacket-2))
	var packets [][]byte
	var cur []byte
	for _, msg := range msgs {
		if cur != nil && len(cur)+binary.MaxVarintLen16+len(msg) > maxGossipPacket {
			packets = append(packets, cur)
			cur = nil
		}
		if cur == nil {
			cur = append(make([]byte, 0, maxGossipPacket), gossipVersion, kindBatch)
		}
		cur = append(binary.AppendUvarint(cur, uint64(len(msg))), msg...)
	}
	if cur != nil {
		packets = append(packets, cur)
	}
	return packets
}

// splitBatch returns the messages of a batch packet (which starts with
// version and kindBatch). It does not retain b beyond the returned slices.
func splitBatch(b []byte) ([][]byte, error) {
	r := &gossipReader{b: b[2:]}
	var msgs [][]byte
	for len(r.b) > 0 {
		n := r.int("batch message length", maxGossipPacket)
		if r.err != nil {
			return msgs, r.err
		}
		if int64(len(r.b)) < n {
			return msgs, fmt.Errorf("batch: %w: a %d-byte message overruns the packet", errMalformedGossip, n)
		}
		msgs = append(msgs, r.b[:n])
		r.b = r.b[n:]
	}
	return msgs, nil
}

func (g *gossip) stats() GossipStats {
	return GossipStats{
		DenialsSent: g.denialsSent.Load(), ResetsSent: g.resetsSent.Load(),
		DenialsReceived: g.denialsReceived.Load(), ResetsReceived: g.resetsReceived.Load(),
		DuplicateResets: g.duplicateResets.Load(),
		Malformed:       g.malformed.Load(), Unsupported: g.unsupported.Load(),
		TooLarge: g.tooLarge.Load(), Dropped: g.dropped.Load(),
		Queued: g.queue.NumQueued(),
	}
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

// receive decodes and applies one packet from a peer: a message or a
// batch. It runs on memberlist's packet goroutine, so it must not block
// for long.
func (g *gossip) receive(b []byte) {
	if len(b) >= 2 && b[0] == gossipVersion && b[1] == kindBatch {
		msgs, err := splitBatch(b)
		for _, msg := range msgs {
			g.receiveOne(msg)
		}
		if err != nil {
			g.malformed.Add(1)
			g.log.Debug("cluster: dropped the rest of a gossip batch", "bytes", len(b), "err", err)
		}
		return
	}
	g.receiveOne(b)
}

// receiveOne decodes and applies one message.
func (g *gossip) receiveOne(b []byte) {
	m, err := decodeGossip(b)
	if err != nil {
		if errors.Is(err, errUnsupportedGossip) {
			g.unsupported.Add(1)
		} else {
			g.malformed.Add(1)
		}
		g.log.Debug("cluster: dropped a gossip message", "bytes", len(b), "err", err)
		return
	}
	n := g.recv.Load()
	switch m.kind {
	case kindDenial:
		if n != nil {
			n.applyDenial(m.denial)
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

// firstSight records a reset id and reports whether it is new.
func (g *gossip) firstSight(id uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if _, ok := g.seen[id]; ok {
		return false
	}
	if len(g.seen) >= 1024 {
		for k, t := range g.seen {
			if now.Sub(t) > resetMemory {
				delete(g.seen, k)
			}
		}
	}
	g.seen[id] = now
	return true
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
