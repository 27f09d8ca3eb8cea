package cluster

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/node"
)

// This file is the gossip's state: what a membership sends and what it
// has taken from each sender, and its counters (queue.go, send.go and
// receive.go are its halves).

const (
	// gossipTransmits is how many times each message goes to each member
	// in a cluster small enough to send to every member, one gossip
	// interval apart: a packet lost once still arrives. In a larger
	// cluster it is the multiplier of the rounds a spread packet goes out
	// (spreadRounds).
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

// gossip is the membership's half of the denial and reset gossip: the
// outgoing queue, and the admission and decoding of incoming packets,
// whose messages it hands to the node it serves.
type gossip struct {
	// queue holds the messages sent to every member (send.go); fresh
	// those that leave once, packed into spread packets; spread the
	// packets that go to a few random members a round and are relayed
	// (spread.go).
	queue  roundQueue
	fresh  roundQueue
	spread spreadQueue
	log    *slog.Logger
	// id is this process's gossip id, the sender of its packets; seq
	// numbers them.
	id  uint64
	seq atomic.Uint64
	// maxAge is Config.GossipMaxAge.
	maxAge time.Duration
	// minDenial is the shortest denial worth a packet (a gossip
	// interval): shorter ones are neither announced nor relayed.
	minDenial time.Duration
	// recv applies received messages: the node the membership serves; nil
	// until a node attaches (messages are dropped meanwhile).
	recv atomic.Pointer[receiver]
	// senders are the gossip ids of the live members but this one, with
	// their names; packets from any other id are dropped.
	senders atomic.Pointer[map[uint64]string]
	// kick wakes the sender when something is queued.
	kick chan struct{}
	// lastStaleWarn is when the log last said that gossip arrives stale
	// (Unix ns).
	lastStaleWarn atomic.Int64

	mu sync.Mutex
	// pending are the queued denials by key, own and relayed, so that a
	// reset can cancel the denials it makes stale.
	pending map[string][]*denialBroadcast
	// windows are the packet numbers taken from each sender, members and
	// recently departed ones.
	windows map[uint64]*replayWindow
	// resets are recently applied reset ids.
	resets recentIDs

	denialsSent, resetsSent, denialsReceived, resetsReceived atomic.Int64
	duplicateResets, capped, malformed, unsupported          atomic.Int64
	unknownSender, replayed, stale, tooLarge, dropped        atomic.Int64
}

// receiver boxes the node.Receiver of received messages, for recv.
type receiver struct{ node.Receiver }

// newGossip returns the gossip of a process whose packets go out as
// sender id and are taken only within maxAge of their sending. Until
// spreadIn says otherwise, it spreads as in a cluster of one and relays
// denials of any length.
func newGossip(log *slog.Logger, id uint64, maxAge time.Duration) *gossip {
	g := &gossip{
		log: log, id: id, maxAge: maxAge, kick: make(chan struct{}, 1),
		pending: make(map[string][]*denialBroadcast), windows: make(map[uint64]*replayWindow),
	}
	g.queue.init(gossipTransmits)
	g.fresh.init(1)
	g.spread.init(func() int { return 1 })
	return g
}

// spreadIn sets, before any gossip, the live members' count, which sets
// how many rounds a spread packet goes out, and the shortest denial worth
// relaying.
func (g *gossip) spreadIn(size func() int, minDenial time.Duration) {
	g.spread.init(size)
	g.minDenial = minDenial
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

func (g *gossip) stats() node.GossipStats {
	return node.GossipStats{
		DenialsSent: g.denialsSent.Load(), ResetsSent: g.resetsSent.Load(),
		DenialsReceived: g.denialsReceived.Load(), ResetsReceived: g.resetsReceived.Load(),
		DuplicateResets: g.duplicateResets.Load(), Capped: g.capped.Load(),
		Malformed: g.malformed.Load(), Unsupported: g.unsupported.Load(),
		UnknownSender: g.unknownSender.Load(), Replayed: g.replayed.Load(), Stale: g.stale.Load(),
		TooLarge: g.tooLarge.Load(), Dropped: g.dropped.Load(),
		Queued: g.queued(), RememberedResets: g.rememberedResets(),
	}
}

// queued is the number of messages and spread packets waiting to go out.
func (g *gossip) queued() int {
	return g.queue.NumQueued() + g.fresh.NumQueued() + g.spread.NumQueued()
}

func (g *gossip) rememberedResets() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resets.len()
}

// delegate plugs the membership into memberlist: metadata and incoming
// gossip. memberlist calls it concurrently; none of it blocks.
type delegate struct{ m *Membership }

func (d delegate) NodeMeta(int) []byte { return d.m.meta() }
func (d delegate) NotifyMsg(b []byte)  { d.m.gossip.receive(b, d.m.spreading()) }

// GetBroadcasts offers nothing to piggyback: gossipLoop sends the gossip
// itself, at once rather than at memberlist's next gossip round.
func (d delegate) GetBroadcasts(int, int) [][]byte { return nil }

// LocalState and MergeRemoteState carry nothing: denials and resets are
// short-lived, and a node that missed one only makes a store call (a
// missed reset leaves its leases and cached denials to expire).
func (d delegate) LocalState(bool) []byte            { return nil }
func (d delegate) MergeRemoteState(_ []byte, _ bool) {}
