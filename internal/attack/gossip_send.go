package attack

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	mathrand "math/rand/v2"
	"net"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// memberlist's packet framing (github.com/hashicorp/memberlist, net.go
// and security.go), as far as a forger needs it.
const (
	// memberlistUserMsg is the message type of a user message, which
	// memberlist hands to quotad's gossip.
	memberlistUserMsg = 8
	// memberlistCRCMsg prefixes a message with its CRC-32.
	memberlistCRCMsg = 12
	// memberlistEncryption is the version byte of AES-GCM without padding.
	memberlistEncryption = 1
	gcmNonceLen          = 12
)

// UserMessage frames p as memberlist's user message: a packet memberlist
// passes to quotad's gossip.
func UserMessage(p []byte) []byte { return append([]byte{memberlistUserMsg}, p...) }

// SealGossip encrypts a memberlist packet under key as a member does
// (encryption version 1: AES-GCM with a random nonce, no label).
func SealGossip(key, plain []byte) ([]byte, error) {
	gcm, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+gcmNonceLen, 1+gcmNonceLen+len(plain)+gcm.Overhead())
	out[0] = memberlistEncryption
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, err
	}
	return gcm.Seal(out, out[1:], plain, nil), nil
}

// OpenGossip decrypts a packet SealGossip (or a member) encrypted under
// key.
func OpenGossip(key, packet []byte) ([]byte, error) {
	gcm, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	if len(packet) < 1+gcmNonceLen+gcm.Overhead() || packet[0] != memberlistEncryption {
		return nil, errors.New("not a memberlist packet of encryption version 1")
	}
	return gcm.Open(nil, packet[1:1+gcmNonceLen], packet[1+gcmNonceLen:], nil)
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// IsGossip reports whether plain, a memberlist packet in the clear, is
// nothing but one of quotad's gossip packets (a user message, with or
// without a CRC): playing it again replays gossip and no memberlist state.
func IsGossip(plain []byte) bool {
	if len(plain) >= 5 && plain[0] == memberlistCRCMsg {
		plain = plain[5:]
	}
	return len(plain) >= 2 && plain[0] == memberlistUserMsg && plain[1] == 2
}

// Victim is a configured policy's key that forged denials target.
type Victim struct {
	Policy, Key string
	Limit       algorithms.Limit
}

// GossipForger sends forged gossip to a node's gossip port (UDP), from a
// socket that never joined, every Every:
//   - a 33-byte packet of gossip version 1 denying each victim
//     for 100 years, and a version-2 one from a sender id nobody has, in
//     the clear;
//   - a reset flood: a packet of ResetsPerPacket resets of the victims'
//     keys under fresh ids, in the clear;
//   - with Key (a key holder who is not a member), the version-2 denials
//     and the reset flood again, sealed under it.
//
// A keyed node drops the clear packets undecrypted, and the sealed ones
// for their unknown sender. Set the fields before Run; Stats may be read
// at any time.
type GossipForger struct {
	// Addr is the node's gossip host:port.
	Addr            string
	Key             []byte
	Victims         []Victim
	ResetsPerPacket int
	Every           time.Duration

	clear, sealed, failed atomic.Int64
}

// ForgerStats counts the packets a GossipForger sent.
type ForgerStats struct {
	// Clear and Sealed count packets sent; Failed those that could not be
	// built or sent.
	Clear, Sealed, Failed int64
}

// Stats returns the counts so far.
func (a *GossipForger) Stats() ForgerStats {
	return ForgerStats{Clear: a.clear.Load(), Sealed: a.sealed.Load(), Failed: a.failed.Load()}
}

// Run forges until ctx ends.
func (a *GossipForger) Run(ctx context.Context) {
	c, err := net.Dial("udp", a.Addr)
	if err != nil {
		a.failed.Add(1)
		return
	}
	defer c.Close()
	// A sender id no member has: ids are random, so one made up now
	// collides with a member's with probability members / 2^64.
	sender := mathrand.Uint64()
	var seq uint64
	t := time.NewTicker(orDefault(a.Every, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // a tick and the end at once: the end wins
			return
		}
		hundredYears := 3_153_599_999 * time.Second
		var denials [][]byte
		for _, v := range a.Victims {
			d := DenialMessage(v.Policy, v.Key, v.Limit, 1, hundredYears)
			denials = append(denials, d)
			a.send(c, UserMessage(append([]byte{1}, d...)), false)
		}
		seq++
		a.send(c, UserMessage(GossipPacket(sender, seq, time.Now(), denials...)), false)
		var resets [][]byte
		for i := range a.ResetsPerPacket {
			if len(a.Victims) == 0 {
				break
			}
			v := a.Victims[i%len(a.Victims)]
			resets = append(resets, ResetMessage(mathrand.Uint64(), v.Policy, v.Key))
		}
		seq++
		flood := UserMessage(GossipPacket(sender, seq, time.Now(), resets...))
		a.send(c, flood, false)
		if a.Key != nil {
			seq++
			a.send(c, UserMessage(GossipPacket(sender, seq, time.Now(), denials...)), true)
			a.send(c, flood, true)
		}
	}
}

func (a *GossipForger) send(c net.Conn, packet []byte, seal bool) {
	if seal {
		var err error
		if packet, err = SealGossip(a.Key, packet); err != nil {
			a.failed.Add(1)
			return
		}
	}
	if _, err := c.Write(packet); err != nil {
		a.failed.Add(1)
		return
	}
	if seal {
		a.sealed.Add(1)
	} else {
		a.clear.Add(1)
	}
}

// GossipReplayer plays captured gossip again: every Every it sends up to
// PerRound of the packets its Source captured (a Tap), as they were on the wire,
// from a fresh socket (a replay). It picks, with Key, the
// packets that carry only quotad's gossip, so that the replay tests
// gossip's own defence and not memberlist's handling of its old pings.
// Set the fields before Run; Stats may be read at any time.
type GossipReplayer struct {
	// Addr is the node's gossip host:port.
	Addr string
	// Source holds the captured packets, oldest first.
	Source   interface{ Captured() [][]byte }
	Key      []byte
	PerRound int
	Every    time.Duration

	rounds, replayed, failed atomic.Int64
}

// ReplayerStats counts the packets a GossipReplayer sent (Replayed,
// Failed) and the rounds it sent some in.
type ReplayerStats struct{ Rounds, Replayed, Failed int64 }

// Stats returns the counts so far.
func (a *GossipReplayer) Stats() ReplayerStats {
	return ReplayerStats{Rounds: a.rounds.Load(), Replayed: a.replayed.Load(), Failed: a.failed.Load()}
}

// Run replays until ctx ends.
func (a *GossipReplayer) Run(ctx context.Context) {
	t := time.NewTicker(orDefault(a.Every, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // a tick and the end at once: the end wins
			return
		}
		var picked [][]byte
		for _, p := range a.Source.Captured() {
			if plain, err := OpenGossip(a.Key, p); err == nil && IsGossip(plain) {
				picked = append(picked, p)
			}
		}
		if len(picked) > a.PerRound {
			picked = picked[len(picked)-a.PerRound:]
		}
		if len(picked) == 0 {
			continue
		}
		c, err := net.Dial("udp", a.Addr)
		if err != nil {
			a.failed.Add(1)
			continue
		}
		a.rounds.Add(1)
		for _, p := range picked {
			if _, err := c.Write(p); err != nil {
				a.failed.Add(1)
			} else {
				a.replayed.Add(1)
			}
		}
		c.Close()
	}
}
