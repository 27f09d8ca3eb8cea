package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

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
