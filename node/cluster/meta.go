package cluster

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/memberlist"
)

// Each member advertises metadata (memberlist's node meta, carried with
// its alive messages and in state exchanges):
//
//	version (1 byte, = 2) | flags (1 byte) | prefix (8 bytes) | store (8 bytes) | gossip id (8 bytes)
//
// Bit 0 of flags says the node is leaving. prefix and store are the first
// 8 bytes of SHA-256 of Config.KeyPrefix and StoreID: the data
// the node limits. gossip id is the sender id of its gossip packets
// (random for each process). Version 1 (two bytes, of quotad before the
// fingerprint) is refused like any other metadata that does not match.
const (
	metaVersion     = 2
	metaLen         = 1 + 1 + 8 + 8 + 8
	metaFlagLeaving = 1
	// refusalWarnEvery is how often at most the log repeats the refusal
	// of one peer.
	refusalWarnEvery = time.Minute
	// maxRefusalsRemembered bounds the peers whose last refusal warning is
	// remembered; past it the record starts over.
	maxRefusalsRemembered = 256
)

// errForeignPeer is why a peer is refused: it limits other data.
var errForeignPeer = errors.New("refused a peer that limits other data")

// fingerprint is what two members must share: hashes of their key prefix
// and their store's identity.
type fingerprint struct{ prefix, store [8]byte }

func newFingerprint(keyPrefix, storeID string) fingerprint {
	var f fingerprint
	p, s := sha256.Sum256([]byte(keyPrefix)), sha256.Sum256([]byte(storeID))
	copy(f.prefix[:], p[:])
	copy(f.store[:], s[:])
	return f
}

// memberMeta is a member's decoded metadata.
type memberMeta struct {
	leaving  bool
	fp       fingerprint
	gossipID uint64
}

func (m memberMeta) encode() []byte {
	b := make([]byte, 0, metaLen)
	var flags byte
	if m.leaving {
		flags |= metaFlagLeaving
	}
	b = append(b, metaVersion, flags)
	b = append(b, m.fp.prefix[:]...)
	b = append(b, m.fp.store[:]...)
	return binary.BigEndian.AppendUint64(b, m.gossipID)
}

// decodeMeta decodes metadata; ok is false unless it is version 2 and
// exactly as long.
func decodeMeta(b []byte) (m memberMeta, ok bool) {
	if len(b) != metaLen || b[0] != metaVersion {
		return memberMeta{}, false
	}
	m.leaving = b[1]&metaFlagLeaving != 0
	copy(m.fp.prefix[:], b[2:10])
	copy(m.fp.store[:], b[10:18])
	m.gossipID = binary.BigEndian.Uint64(b[18:26])
	return m, true
}

// meta is this node's metadata as of now.
func (m *Membership) meta() []byte {
	return memberMeta{leaving: m.leaving.Load(), fp: m.fp, gossipID: m.gossip.id}.encode()
}

func metaLeaving(b []byte) bool {
	m, ok := decodeMeta(b)
	return ok && m.leaving
}

// admitPeer returns nil if a peer advertising meta limits the same data as
// this node, and otherwise errForeignPeer saying what differs, which it
// also logs (at most every refusalWarnEvery per peer) and counts.
func (m *Membership) admitPeer(name, addr string, meta []byte) error {
	peer, ok := decodeMeta(meta)
	var why string
	switch {
	case !ok:
		why = "it advertises no quotad fingerprint (a quotad older than this one, or not quotad)"
	case peer.fp.prefix != m.fp.prefix && peer.fp.store != m.fp.store:
		why = "it uses another key prefix and another Redis"
	case peer.fp.prefix != m.fp.prefix:
		why = "it uses another key prefix"
	case peer.fp.store != m.fp.store:
		why = "it uses another Redis"
	default:
		return nil
	}
	m.refused.Add(1)
	m.warnRefusal(name, addr, why, peer.fp)
	return fmt.Errorf("%w: %s at %s: %s", errForeignPeer, name, addr, why)
}

func (m *Membership) warnRefusal(name, addr, why string, theirs fingerprint) {
	now := time.Now()
	m.refusedMu.Lock()
	last, seen := m.refusedAt[name]
	if seen && now.Sub(last) < refusalWarnEvery {
		m.refusedMu.Unlock()
		return
	}
	if len(m.refusedAt) >= maxRefusalsRemembered {
		clear(m.refusedAt)
	}
	m.refusedAt[name] = now
	m.refusedMu.Unlock()
	m.log.Warn("cluster: refused a peer: "+why+"; every member must use the same --key-prefix and the same Redis, or its denials and resets would apply to other counters",
		"peer", name, "addr", addr, "key_prefix", m.cfg.KeyPrefix, "redis", m.cfg.StoreID,
		"our_fingerprint", m.fp.String(), "their_fingerprint", theirs.String())
}

// String is the fingerprint in hex, prefix then store, for logs.
func (f fingerprint) String() string {
	return hex.EncodeToString(f.prefix[:]) + "-" + hex.EncodeToString(f.store[:])
}

// guard refuses peers that limit other data. memberlist asks it about
// every alive message (including those a state exchange brings) and about
// every join's state exchange as a whole; it runs under memberlist's
// locks and does not block.
type guard struct{ m *Membership }

var (
	_ memberlist.AliveDelegate = guard{}
	_ memberlist.MergeDelegate = guard{}
)

// NotifyAlive refuses one peer: memberlist then ignores the message, so
// the peer is never a member here and its gossip is dropped.
func (g guard) NotifyAlive(peer *memberlist.Node) error {
	return g.m.admitPeer(peer.Name, peer.Address(), peer.Meta)
}

// NotifyMerge refuses a join's state exchange when any live node in it
// is foreign, so that the join fails on both sides with the reason
// instead of merging a mixed view.
func (g guard) NotifyMerge(peers []*memberlist.Node) error {
	for _, p := range peers {
		if p.State != memberlist.StateAlive && p.State != memberlist.StateSuspect {
			continue
		}
		if err := g.m.admitPeer(p.Name, p.Address(), p.Meta); err != nil {
			return err
		}
	}
	return nil
}
