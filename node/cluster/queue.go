package cluster

import (
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// This file is the send queue: the denials and resets waiting to go out,
// each sent a fixed number of rounds (roundQueue), a newer one replacing
// or cancelling an older one of the same key.

// roundQueue is memberlist's TransmitLimitedQueue put to a use it was not
// built for: sending each message a fixed number of rounds to every
// member. The queue hands out a message RetransmitMult ×
// ceil(log10(NumNodes+1)) times, meant as transmissions to a few random
// members that relay it; quotad's receivers do not relay user messages,
// so the sender (send.go) sends every round to every member itself, and
// NumNodes is pinned to 1 so that a message goes out exactly rounds
// times, whatever the cluster's size. It keeps the queue's other
// properties: the newest message of a name (a key) replaces an older one,
// and Prune drops the oldest.
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
