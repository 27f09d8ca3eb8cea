package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// Gossip messages tell the other nodes what spares them store calls
// (denials) or what they must forget (resets). They travel as memberlist
// user packets (UDP, encrypted and authenticated with the cluster key),
// batched: in a cluster of up to four each node sends its own to every
// live member twice; in a larger one members relay each packet to a few
// random members (see Membership.gossipLoop and spread.go).
//
// Wire format, version 2. A packet is a header and one or more messages:
//
//	version (1 byte, = 2) | sender (8 bytes) | seq (8 bytes) | sent_ms (8 bytes) |
//	(length (uvarint) | message)…
//
// sender is the gossip id of the process that first sent the packet (random
// at its start, and advertised in its membership metadata), seq numbers
// its packets from 1, and sent_ms is the wall clock of the member that sent
// this copy (the first sender or a relay) when it sent it, in milliseconds
// since the Unix epoch; all three big endian. A relay keeps sender and seq. A message is
//
//	denial: kind (1 byte, = 1) | policy | key | algorithm (1 byte) | limit |
//	        period_ms | burst | cost | retry_after_ms | reset_after_ms | remaining
//	reset:  kind (1 byte, = 2) | id (8 bytes, big endian) | policy | key
//
// where policy and key are a uvarint length then the bytes, and the other
// numbers are uvarints. A packet and each message must be exactly this
// long: a node drops (and counts) anything else, including packets of
// another version, so a later version is a new version byte, never a
// silent extension. (Version 1 had no header, so its packets, which start
// with the byte 1, are dropped as another version.)
//
// The header is what lets a receiver refuse replays (gossip.admit): it
// takes a packet only from a current member's gossip id, only once per
// seq, and only within GossipMaxAge of sent_ms on its own clock.
//
// A denial carries durations: how long it still holds when the packet is
// sent (recomputed for every retransmission and relay). The receiver
// counts them down from sent_ms when its clock says the packet is older
// than that (a packet delayed, or replayed, holds no longer than the
// original), and from arrival otherwise, so a clock ahead of the sender's
// only shortens a denial, and one behind never lengthens it.
const (
	gossipVersion = 2
	kindDenial    = 1
	kindReset     = 2
	// packetHeaderLen is the length of a packet's header.
	packetHeaderLen = 1 + 8 + 8 + 8
	// maxGossipPacket bounds a packet: memberlist's 1400-byte UDP buffer
	// less its headers, a checksum and the encryption overhead, with room
	// to spare.
	maxGossipPacket = 1200
	// maxGossipMessage bounds one message so that it fits in a packet
	// (the header, then 2 bytes of length). A longer one (a key near the
	// 1 KiB limit with a long policy name) is not gossiped.
	maxGossipMessage = maxGossipPacket - packetHeaderLen - 2
)

// Sentinels of decodeGossip and splitPacket.
var (
	errMalformedGossip   = errors.New("malformed gossip message")
	errUnsupportedGossip = errors.New("unsupported gossip version")
)

// packetHeader is a packet's header: who sent it, its number and when.
type packetHeader struct {
	sender, seq uint64
	sentMs      int64 // Unix ms, >= 0
}

// appendPacket appends a packet of msgs, each a message's encoding, under
// h to b.
func appendPacket(b []byte, h packetHeader, msgs ...[]byte) []byte {
	b = append(b, gossipVersion)
	b = binary.BigEndian.AppendUint64(b, h.sender)
	b = binary.BigEndian.AppendUint64(b, h.seq)
	b = binary.BigEndian.AppendUint64(b, uint64(h.sentMs))
	for _, m := range msgs {
		b = append(binary.AppendUvarint(b, uint64(len(m))), m...)
	}
	return b
}

// splitPacket returns a packet's header and its messages, which alias b.
// A packet must hold at least one message and nothing after the last.
// Errors wrap errMalformedGossip or errUnsupportedGossip; it never panics.
func splitPacket(b []byte) (packetHeader, [][]byte, error) {
	r := &gossipReader{b: b}
	if v := r.byte("version"); r.err == nil && v != gossipVersion {
		return packetHeader{}, nil, fmt.Errorf("version %d: %w", v, errUnsupportedGossip)
	}
	h := packetHeader{sender: r.uint64("sender"), seq: r.uint64("seq")}
	sent := r.uint64("sent_ms")
	if r.err == nil && sent > math.MaxInt64 {
		r.fail("sent_ms", "%d is not a time", sent)
	}
	h.sentMs = int64(sent)
	var msgs [][]byte
	for r.err == nil && len(r.b) > 0 {
		n := r.int("message length", maxGossipPacket)
		switch {
		case r.err != nil:
		case int64(len(r.b)) < n:
			r.fail("message", "%d bytes overrun the packet", n)
		default:
			msgs = append(msgs, r.b[:n])
			r.b = r.b[n:]
		}
	}
	if r.err == nil && len(msgs) == 0 {
		r.fail("packet", "no messages")
	}
	if r.err != nil {
		return packetHeader{}, nil, r.err
	}
	return h, msgs, nil
}

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
	b = append(b, kindDenial)
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
	b = append(b, kindReset)
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

// decodeGossip decodes and validates one message of a packet. Errors
// wrap errMalformedGossip; it never panics, whatever b holds, and it does
// not retain b.
func decodeGossip(b []byte) (gossipMsg, error) {
	r := &gossipReader{b: b}
	m := gossipMsg{kind: r.byte("kind")}
	switch {
	case r.err != nil:
	case m.kind == kindDenial:
		d := &m.denial
		d.policy = r.string("policy", node.MaxPolicyNameLen)
		d.key = r.string("key", node.MaxKeyLen)
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
		m.reset.policy = r.string("policy", node.MaxPolicyNameLen)
		m.reset.key = r.string("key", node.MaxKeyLen)
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
	if err := node.ValidatePolicyName(policy); err != nil {
		return fmt.Errorf("%w: %w", errMalformedGossip, err)
	}
	if err := node.ValidateKey(key); err != nil {
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
