package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/quotad/quotad/algorithms"
)

// Gossip messages tell the other nodes what spares them store calls
// (denials) or what they must forget (resets). Each node sends its own to
// every live member as memberlist user packets (UDP, encrypted when the
// cluster has a key), batched, twice (see Membership.gossipLoop).
//
// Wire format, version 1. Every message is
//
//	version (1 byte, = 1) | kind (1 byte) | body
//
// A packet holds one message, or a batch: kind 3, then for each message
// its length (uvarint) and the message. The body of kind 1 (denial) is
//
//	policy | key | algorithm (1 byte) | limit | period_ms | burst |
//	cost | retry_after_ms | reset_after_ms | remaining
//
// and that of kind 2 (reset)
//
//	id (8 bytes, big endian) | policy | key
//
// where policy and key are a uvarint length then the bytes, and the other
// numbers are uvarints. A message must be exactly this long: a node drops
// (and counts) anything else, including messages of another version, so a
// later version is a new version byte, never a silent extension.
//
// Time travels as durations, not clock readings: a denial carries how long
// it still holds when the packet is built (recomputed for every
// retransmission), and the receiver measures that from when it decodes it.
// No clock agreement between nodes is assumed. A received denial can
// outlast the authority's by the packet's one-way delay (well under a
// millisecond on a LAN); both ends round down to whole milliseconds, which
// usually more than makes up for it, and a denial that holds a moment too
// long only under-admits.
const (
	gossipVersion = 1
	kindDenial    = 1
	kindReset     = 2
	kindBatch     = 3
	// maxGossipPacket bounds a packet: memberlist's 1400-byte UDP buffer
	// less its headers, a checksum and the encryption overhead, with room
	// to spare.
	maxGossipPacket = 1200
	// maxGossipMessage bounds one message so that it fits in a batch
	// packet (2 bytes of batch header, 2 of length). A longer one (a key
	// near the 1 KiB limit with a long policy name) is not gossiped.
	maxGossipMessage = maxGossipPacket - 4
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
	// resetMemory is how long a reset's id is remembered, so that
	// retransmissions do not reset the key again and drop leases taken
	// since; memberlist stops retransmitting within seconds.
	resetMemory = time.Minute
)

// Sentinels of decodeGossip.
var (
	errMalformedGossip   = errors.New("malformed gossip message")
	errUnsupportedGossip = errors.New("unsupported gossip version")
)

// denialMsg says that the authority denied cost units of key under limit:
// checks of at least that cost are denied for retryAfter more.
type denialMsg struct {
	policy, key            string
	limit                  algorithms.Limit
	cost                   int64 // >= 1
	retryAfter, resetAfter time.Duration
	remaining              int64
}

// resetMsg says that key was reset at the authority.
type resetMsg struct {
	id          uint64
	policy, key string
}

// gossipMsg is one decoded message: kind says which field is set.
type gossipMsg struct {
	kind   byte
	denial denialMsg
	reset  resetMsg
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// appendDenial appends m's encoding to b. m must be valid (as
// decodeGossip checks).
func appendDenial(b []byte, m denialMsg) []byte {
	b = append(b, gossipVersion, kindDenial)
	b = appendString(b, m.policy)
	b = appendString(b, m.key)
	b = append(b, byte(m.limit.Algorithm))
	for _, v := range [...]int64{m.limit.Limit, m.limit.PeriodMillis(), m.limit.Burst, m.cost, m.retryAfter.Milliseconds(), m.resetAfter.Milliseconds(), m.remaining} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	return b
}

// appendReset appends m's encoding to b.
func appendReset(b []byte, m resetMsg) []byte {
	b = append(b, gossipVersion, kindReset)
	b = binary.BigEndian.AppendUint64(b, m.id)
	b = appendString(b, m.policy)
	return appendString(b, m.key)
}

// gossipReader decodes fields in order; the first failure sticks and
// names its field.
type gossipReader struct {
	b   []byte
	err error
}

func (r *gossipReader) fail(field, format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%s: %w: %s", field, errMalformedGossip, fmt.Sprintf(format, args...))
	}
}

func (r *gossipReader) byte(field string) byte {
	if r.err != nil || len(r.b) < 1 {
		r.fail(field, "truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *gossipReader) uint64(field string) uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.fail(field, "truncated")
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// int reads a uvarint that must fit an int64 and be at most maxV.
func (r *gossipReader) int(field string, maxV int64) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(field, "bad varint")
		return 0
	}
	r.b = r.b[n:]
	if v > uint64(maxV) {
		r.fail(field, "%d exceeds %d", v, maxV)
		return 0
	}
	return int64(v)
}

func (r *gossipReader) string(field string, maxLen int) string {
	n := r.int(field+" length", int64(maxLen))
	if r.err != nil {
		return ""
	}
	if int64(len(r.b)) < n {
		r.fail(field, "truncated")
		return ""
	}
	s := string(r.b[:n]) // a copy: memberlist reuses the buffer
	r.b = r.b[n:]
	return s
}

// maxMillis is the most milliseconds a time.Duration holds.
const maxMillis = math.MaxInt64 / int64(time.Millisecond)

// decodeGossip decodes and validates one message. Errors wrap
// errMalformedGossip or errUnsupportedGossip; it never panics, whatever b
// holds, and it does not retain b.
func decodeGossip(b []byte) (gossipMsg, error) {
	r := &gossipReader{b: b}
	if v := r.byte("version"); r.err == nil && v != gossipVersion {
		return gossipMsg{}, fmt.Errorf("version %d: %w", v, errUnsupportedGossip)
	}
	m := gossipMsg{kind: r.byte("kind")}
	switch {
	case r.err != nil:
	case m.kind == kindDenial:
		d := &m.denial
		d.policy = r.string("policy", MaxPolicyNameLen)
		d.key = r.string("key", MaxKeyLen)
		d.limit.Algorithm = algorithms.Algorithm(r.byte("algorithm"))
		d.limit.Limit = r.int("limit", math.MaxInt64)
		d.limit.Period = time.Duration(r.int("period", maxMillis)) * time.Millisecond
		d.limit.Burst = r.int("burst", math.MaxInt64)
		d.cost = r.int("cost", math.MaxInt64)
		d.retryAfter = time.Duration(r.int("retry_after", maxMillis)) * time.Millisecond
		d.resetAfter = time.Duration(r.int("reset_after", maxMillis)) * time.Millisecond
		d.remaining = r.int("remaining", math.MaxInt64)
		if r.err == nil {
			r.err = validateDenial(*d)
		}
	case m.kind == kindReset:
		m.reset.id = r.uint64("id")
		m.reset.policy = r.string("policy", MaxPolicyNameLen)
		m.reset.key = r.string("key", MaxKeyLen)
		if r.err == nil {
			r.err = validateNames(m.reset.policy, m.reset.key)
		}
	default:
		r.fail("kind", "unknown kind %d", m.kind)
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("message", "%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return gossipMsg{}, r.err
	}
	return m, nil
}

func validateNames(policy, key string) error {
	if err := ValidatePolicyName(policy); err != nil {
		return fmt.Errorf("%w: %w", errMalformedGossip, err)
	}
	if err := ValidateKey(key); err != nil {
		return fmt.Errorf("%w: %w", errMalformedGossip, err)
	}
	return nil
}

// validateDenial holds a decoded denial to what a node's own store call
// could have produced.
func validateDenial(d denialMsg) error {
	if err := validateNames(d.policy, d.key); err != nil {
		return err
	}
	if err := d.limit.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errMalformedGossip, err)
	}
	capacity := d.limit.Capacity()
	switch {
	case d.cost < 1 || d.cost > capacity:
		return fmt.Errorf("cost: %w: %d outside 1..%d", errMalformedGossip, d.cost, capacity)
	case d.remaining > capacity:
		return fmt.Errorf("remaining: %w: %d above the capacity %d", errMalformedGossip, d.remaining, capacity)
	}
	return nil
}

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
