package cluster

import (
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// This file is the send queue: the denials and resets waiting to go out,
// each taken a fixed number of rounds (roundQueue), a newer one replacing
// or cancelling an older one of the same key. Where they go from there
// depends on the cluster's size (send.go, spread.go).

// roundQueue is memberlist's TransmitLimitedQueue handing out each
// message a fixed number of rounds. The queue hands out a message
// RetransmitMult × ceil(log10(NumNodes+1)) times; NumNodes is pinned to 1
// so that a message goes out exactly rounds times, whatever the cluster's
// size. It keeps the queue's other properties: the newest message of a
// name (a key) replaces an older one, and Prune drops the oldest.
type roundQueue struct {
	memberlist.TransmitLimitedQueue
}

// init makes q send each message rounds times.
func (q *roundQueue) init(rounds int) {
	q.NumNodes = func() int { return 1 }
	q.RetransmitMult = rounds
}

// keyName identifies a key in the queue; policy names cannot hold NUL.
func keyName(policy, key string) string { return policy + "\x00" + key }

// queueDenial broadcasts m, whose durations were measured at at (a time
// with a monotonic reading): to every member, or, when spreading, once
// into a spread packet that members relay. A newer denial of the same key
// replaces one still queued.
func (g *gossip) queueDenial(m denialMsg, at time.Time, spreading bool) {
	b := &denialBroadcast{msg: m, at: at, name: "d" + keyName(m.policy, m.key), g: g}
	if len(b.Message()) > maxGossipMessage {
		g.tooLarge.Add(1)
		return
	}
	g.track(b)
	q := g.sendQueue(spreading)
	q.QueueBroadcast(b)
	g.denialsSent.Add(1)
	g.prune(q)
	g.wake()
}

// queueReset broadcasts that key was reset, as queueDenial does,
// cancelling the queued denials of it: they predate the reset.
func (g *gossip) queueReset(policy, key string, spreading bool) {
	msg := appendReset(nil, resetMsg{id: rand.Uint64(), policy: policy, key: key})
	if len(msg) > maxGossipMessage {
		g.tooLarge.Add(1)
		return
	}
	g.cancelDenial(policy, key)
	q := g.sendQueue(spreading)
	q.QueueBroadcast(&resetBroadcast{msg: msg, name: "r" + keyName(policy, key)})
	g.resetsSent.Add(1)
	g.prune(q)
	g.wake()
}

// sendQueue is the queue of this node's own messages: fresh ones leave
// once, in a spread packet; the others go to every member, round after
// round.
func (g *gossip) sendQueue(spreading bool) *roundQueue {
	if spreading {
		return &g.fresh
	}
	return &g.queue
}

func (g *gossip) prune(q *roundQueue) {
	if n := q.NumQueued(); n > maxQueuedGossip {
		q.Prune(maxQueuedGossip)
		g.dropped.Add(int64(n - maxQueuedGossip))
	}
}

// track records a queued denial, own or relayed, under its key, so that a
// reset of the key can cancel it.
func (g *gossip) track(b *denialBroadcast) {
	k := keyName(b.msg.policy, b.msg.key)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pending[k] = append(g.pending[k], b)
}

// untrack forgets a denial track recorded, once it no longer goes out.
func (g *gossip) untrack(b *denialBroadcast) {
	k := keyName(b.msg.policy, b.msg.key)
	g.mu.Lock()
	defer g.mu.Unlock()
	queued := g.pending[k]
	for i, q := range queued {
		if q == b {
			queued = append(queued[:i], queued[i+1:]...)
			break
		}
	}
	if len(queued) == 0 {
		delete(g.pending, k)
	} else {
		g.pending[k] = queued
	}
}

// cancelDenial makes every queued denial of key, own or relayed, go out as
// already expired from now on (memberlist has no way to withdraw a queued
// broadcast).
func (g *gossip) cancelDenial(policy, key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, b := range g.pending[keyName(policy, key)] {
		b.cancelled.Store(true)
	}
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
func (b *denialBroadcast) Finished() { b.g.untrack(b) }

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
