package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// Internal tests of the gossip wire format and of what a receiver admits:
// they are unexported, and what must hold is their contract, not a node's
// behaviour.

var sampleDenial = denialMsg{
	policy: "api", key: "user:42",
	limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100, Period: time.Minute, Burst: 20},
	cost:  3, retryAfter: 1500 * time.Millisecond, resetAfter: 12 * time.Second, remaining: 1,
}

var sampleReset = resetMsg{id: 0x0123456789abcdef, policy: "api", key: "user:42"}

var sampleHeader = packetHeader{sender: 0x1122334455667788, seq: 5, sentMs: 1_700_000_000_000}

func TestGossipRoundTrip(t *testing.T) {
	long := denialMsg{
		policy: strings.Repeat("p", node.MaxPolicyNameLen), key: strings.Repeat("k", 990),
		limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: algorithms.MaxExact, Period: algorithms.MaxPeriod},
		cost:  algorithms.MaxExact, retryAfter: algorithms.MaxPeriod, resetAfter: algorithms.MaxPeriod, remaining: 0,
	}
	for _, want := range []gossipMsg{{kind: kindDenial, denial: sampleDenial}, {kind: kindDenial, denial: long}, {kind: kindReset, reset: sampleReset}} {
		var b []byte
		if want.kind == kindDenial {
			b = appendDenial(nil, want.denial)
		} else {
			b = appendReset(nil, want.reset)
		}
		got, err := decodeGossip(b)
		if err != nil {
			t.Fatalf("decode %x: %v", b, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip: got %+v, want %+v", got, want)
		}
		if len(b) > maxGossipMessage {
			t.Errorf("a %d-byte key encodes to %d bytes, over the %d a packet carries", len(want.denial.key), len(b), maxGossipMessage)
		}
	}
	// The wire format is fixed: a change to it needs a new version byte.
	denial := appendDenial(nil, sampleDenial)
	if !bytes.Equal(denial, []byte{
		1, 3, 'a', 'p', 'i', 7, 'u', 's', 'e', 'r', ':', '4', '2', 4, 100, 0xe0, 0xd4, 0x03, 20, 3, 0xdc, 0x0b, 0xe0, 0x5d, 1,
	}) {
		t.Fatalf("denial encodes as %v", denial)
	}
	if n := len(appendReset(nil, sampleReset)); n != 1+8+4+8 {
		t.Fatalf("reset encodes to %d bytes", n)
	}
	pkt := appendPacket(nil, sampleHeader, denial)
	if !bytes.Equal(pkt[:packetHeaderLen+1], []byte{
		2, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, byte(len(denial)),
	}) || !bytes.Equal(pkt[packetHeaderLen+1:], denial) {
		t.Fatalf("packet encodes as %v", pkt)
	}
	h, msgs, err := splitPacket(pkt)
	if err != nil || h != sampleHeader || len(msgs) != 1 || !bytes.Equal(msgs[0], denial) {
		t.Fatalf("splitPacket: %+v, %x, %v", h, msgs, err)
	}
}

func TestGossipRejectsMalformedMessages(t *testing.T) {
	denial := appendDenial(nil, sampleDenial)
	with := func(f func(*denialMsg)) []byte {
		d := sampleDenial
		f(&d)
		return appendDenial(nil, d)
	}
	cases := map[string][]byte{
		"empty":             nil,
		"unknown kind":      {9},
		"truncated denial":  denial[:len(denial)-1],
		"trailing byte":     append(bytes.Clone(denial), 0),
		"bad policy name":   with(func(d *denialMsg) { d.policy = "a:b" }),
		"empty key":         with(func(d *denialMsg) { d.key = "" }),
		"unknown algorithm": with(func(d *denialMsg) { d.limit.Algorithm = 99 }),
		"zero limit":        with(func(d *denialMsg) { d.limit.Limit = 0 }),
		"burst on a window": with(func(d *denialMsg) {
			d.limit = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: time.Second, Burst: 2}
		}),
		"cost zero":          with(func(d *denialMsg) { d.cost = 0 }),
		"cost over capacity": with(func(d *denialMsg) { d.cost = 21 }),
		"remaining too high": with(func(d *denialMsg) { d.remaining = 21 }),
		"key too long":       with(func(d *denialMsg) { d.key = strings.Repeat("k", node.MaxKeyLen+1) }),
		"length past end":    {1, 200, 1, 'a'},
		"overlong varint":    append([]byte{1}, bytes.Repeat([]byte{0xff}, 11)...),
		"truncated reset id": {2, 0, 0, 0},
		"reset bad policy":   appendReset(nil, resetMsg{policy: "", key: "k"}),
	}
	for name, msg := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeGossip(msg); !errors.Is(err, errMalformedGossip) {
				t.Fatalf("decode %x: %v; want %v", msg, err, errMalformedGossip)
			}
		})
	}

	pkt := appendPacket(nil, sampleHeader, denial)
	packets := map[string]struct {
		pkt         []byte
		unsupported bool
	}{
		// A 33-byte packet of gossip version 1: a denial.
		"version 1":          {pkt: append([]byte{1}, denial...), unsupported: true},
		"future version":     {pkt: append([]byte{3}, pkt[1:]...), unsupported: true},
		"empty":              {pkt: nil},
		"truncated header":   {pkt: pkt[:packetHeaderLen-1]},
		"no messages":        {pkt: pkt[:packetHeaderLen]},
		"message overruns":   {pkt: pkt[:len(pkt)-1]},
		"empty message":      {pkt: append(bytes.Clone(pkt[:packetHeaderLen]), 0)},
		"sent_ms not a time": {pkt: append(append(bytes.Clone(pkt[:17]), 0x80, 0, 0, 0, 0, 0, 0, 0), pkt[packetHeaderLen:]...)},
	}
	for name, tc := range packets {
		t.Run("packet "+name, func(t *testing.T) {
			_, msgs, err := splitPacket(tc.pkt)
			want := errMalformedGossip
			if tc.unsupported {
				want = errUnsupportedGossip
			}
			if name == "empty message" {
				// Framing is fine; the empty message itself is malformed.
				if err != nil || len(msgs) != 1 {
					t.Fatalf("split %x: %x, %v", tc.pkt, msgs, err)
				}
				_, err = decodeGossip(msgs[0])
			}
			if !errors.Is(err, want) {
				t.Fatalf("split %x: %v; want %v", tc.pkt, err, want)
			}
		})
	}
}

// A queued denial goes out with the time it has left, and a cancelled one
// as already over.
func TestDenialBroadcastCountsDown(t *testing.T) {
	g := newGossip(nil, 1, DefaultGossipMaxAge)
	at := time.Now().Add(-500 * time.Millisecond)
	b := &denialBroadcast{g: g, msg: sampleDenial, at: at, name: "d"}
	m, err := decodeGossip(b.Message())
	if err != nil {
		t.Fatal(err)
	}
	if r := m.denial.retryAfter; r > time.Second || r < 900*time.Millisecond {
		t.Fatalf("retry_after %s half a second after a 1.5s denial; want about 1s", r)
	}
	if r := m.denial.resetAfter; r > 11500*time.Millisecond || r < 11*time.Second {
		t.Fatalf("reset_after %s; want about 11.5s", r)
	}
	b.cancelled.Store(true)
	if m, _ := decodeGossip(b.Message()); m.denial.retryAfter != 0 {
		t.Fatalf("a cancelled denial goes out with retry_after %s", m.denial.retryAfter)
	}
}

// Queued messages go out in packets that fit the packet size, numbered in
// order and stamped with the send time, each message gossipTransmits
// times, and split back into the same messages.
func TestGossipBatches(t *testing.T) {
	g := newGossip(slog.New(slog.DiscardHandler), 42, DefaultGossipMaxAge)
	want := map[string]bool{}
	for i := range 30 {
		d := sampleDenial
		d.key = fmt.Sprintf("%03d-%s", i, strings.Repeat("k", 200))
		d.retryAfter = time.Hour
		g.queueDenial(d, time.Now(), false)
		want[d.key] = true
	}
	g.queueReset("api", "reset-me", false)
	now := time.UnixMilli(1_700_000_000_000)
	var seq uint64
	for round := range gossipTransmits + 1 {
		packets := g.nextPackets(now)
		if round == gossipTransmits {
			if len(packets) != 0 {
				t.Fatalf("round %d sent %d packets; every message had gone out %d times", round, len(packets), gossipTransmits)
			}
			break
		}
		got := map[string]bool{}
		resets := 0
		for _, pkt := range packets {
			if len(pkt) > maxGossipPacket {
				t.Fatalf("a %d-byte packet", len(pkt))
			}
			h, msgs, err := splitPacket(pkt)
			if err != nil {
				t.Fatal(err)
			}
			if seq++; h != (packetHeader{sender: 42, seq: seq, sentMs: now.UnixMilli()}) {
				t.Fatalf("packet header %+v; want sender 42, seq %d, sent %d", h, seq, now.UnixMilli())
			}
			for _, b := range msgs {
				m, err := decodeGossip(b)
				if err != nil {
					t.Fatal(err)
				}
				if m.kind == kindReset {
					resets++
				} else {
					got[m.denial.key] = true
				}
			}
		}
		if len(packets) < 6 || !reflect.DeepEqual(got, want) || resets != 1 {
			t.Fatalf("round %d: %d packets carrying %d of %d denials and %d resets", round, len(packets), len(got), len(want), resets)
		}
	}
}

// A receiver takes a packet only from a current member, within the
// maximum age of its send time, once per number; a number far behind the
// newest is refused too. Each refusal is counted by its reason.
func TestGossipAdmission(t *testing.T) {
	g := newGossip(slog.New(slog.DiscardHandler), 1, 10*time.Second)
	now := time.Now()
	h := func(sender, seq uint64, sentAgo time.Duration) packetHeader {
		return packetHeader{sender: sender, seq: seq, sentMs: now.Add(-sentAgo).UnixMilli()}
	}
	if g.admit(h(7, 1, 0), now) {
		t.Fatal("admitted a packet before knowing any member")
	}
	g.setSenders(map[uint64]string{7: "b", 8: "c"}, now)
	steps := []struct {
		h    packetHeader
		want bool
	}{
		{h(9, 1, 0), false},                // not a member
		{h(1, 1, 0), false},                // this node's own id: never sent to itself
		{h(7, 1, 11*time.Second), false},   // stale
		{h(7, 1, -11*time.Second), false},  // from the future
		{h(7, 1, 9*time.Second), true},     // old but within the age
		{h(7, 1, 0), false},                // replayed
		{h(7, 3, 0), true},                 // a gap ...
		{h(7, 2, 0), true},                 // ... filled late
		{h(7, 2, 0), false},                // replayed
		{h(8, 1, 0), true},                 // numbers are per sender
		{h(7, 3+replayWindowLen, 0), true}, // far ahead
		{h(7, 3, 0), false},                // fell out of the window
		{h(7, 4, 0), true},                 // the oldest number still inside it
		{h(7, 0, 0), false},                // numbers start at 1
	}
	for i, s := range steps {
		if got := g.admit(s.h, now); got != s.want {
			t.Fatalf("step %d: admit(%+v) = %v; want %v", i, s.h, got, s.want)
		}
	}
	st := g.stats()
	if st.UnknownSender != 3 || st.Stale != 2 || st.Replayed != 4 {
		t.Fatalf("unknown sender %d, stale %d, replayed %d; want 3, 2, 4", st.UnknownSender, st.Stale, st.Replayed)
	}
	// A member that dies and comes back within twice the age keeps its
	// window: its old packets are still refused.
	g.setSenders(map[uint64]string{8: "c"}, now)
	g.setSenders(map[uint64]string{8: "c"}, now.Add(5*time.Second))
	g.setSenders(map[uint64]string{7: "b", 8: "c"}, now.Add(6*time.Second))
	if g.admit(h(7, 2, 0), now) {
		t.Fatal("a returning member's old packet was admitted again")
	}
	// One gone for longer is forgotten: the windows stay bounded.
	g.setSenders(map[uint64]string{8: "c"}, now)
	g.setSenders(map[uint64]string{8: "c"}, now.Add(21*time.Second))
	if _, kept := g.windows[7]; kept || len(g.windows) != 1 {
		t.Fatalf("windows %v after b left 21s ago; want only c's", g.windows)
	}
}

// A forged denial (retry_after 3,153,599,999s for a
// configured 1500/10s limit) is cut to what the limit can justify, for
// every algorithm; an honest one is left alone.
func TestGossipCapsDenials(t *testing.T) {
	hundredYears := 3_153_599_999 * time.Second
	for _, a := range algorithms.Algorithms() {
		d := denialMsg{
			policy: "api", key: "victim", limit: algorithms.Limit{Algorithm: a, Limit: 1500, Period: 10 * time.Second},
			cost: 1, retryAfter: hundredYears, resetAfter: hundredYears,
		}
		if !capDenial(&d) {
			t.Fatalf("%s: a 100-year denial was not capped", a)
		}
		maxRetry := 20 * time.Second // 2 periods: the sliding log with a full-period lease, the counter
		if d.retryAfter > maxRetry || d.resetAfter > maxRetry || d.retryAfter <= 0 {
			t.Fatalf("%s: capped to retry_after %s, reset_after %s; want within (0, %s]", a, d.retryAfter, d.resetAfter, maxRetry)
		}
		honest := denialMsg{limit: d.limit, cost: 1, retryAfter: 5 * time.Millisecond, resetAfter: 5 * time.Second}
		if capDenial(&honest) || honest.retryAfter != 5*time.Millisecond {
			t.Fatalf("%s: an honest denial was capped: %+v", a, honest)
		}
	}
}

// A flood of resets, each with a new id, leaves at most maxResetIDs
// remembered, and each costs the same whatever came before (the ids are
// dropped oldest first, never searched). Retransmissions of recent resets
// are still recognised.
func TestRecentResetIDsAreBounded(t *testing.T) {
	var r recentIDs
	now := time.Now()
	const flood = 200_000
	for i := range uint64(flood) {
		if !r.add(i+1, now) {
			t.Fatalf("id %d reported seen", i+1)
		}
		if r.len() > maxResetIDs || len(r.set) > maxResetIDs {
			t.Fatalf("after %d ids: %d remembered (%d in the set); the bound is %d", i+1, r.len(), len(r.set), maxResetIDs)
		}
	}
	if r.add(flood, now) || r.add(flood-maxResetIDs+1, now) {
		t.Fatal("a recent id was not recognised")
	}
	if !r.add(flood-maxResetIDs, now) {
		t.Fatal("an id older than the last maxResetIDs is still remembered")
	}
	// Ids older than resetMemory go first, whatever the count.
	if !r.add(1, now.Add(resetMemory+time.Second)) || r.len() != 1 {
		t.Fatalf("%d ids remembered after resetMemory; want only the newest", r.len())
	}
}

// FuzzDecodeGossip: a receiver never panics, whatever arrives; whatever
// splits and decodes re-encodes to the same packet and messages.
func FuzzDecodeGossip(f *testing.F) {
	now := time.Now()
	h := packetHeader{sender: 7, seq: 1, sentMs: now.UnixMilli()}
	f.Add(appendPacket(nil, h, appendDenial(nil, sampleDenial)))
	f.Add(appendPacket(nil, h, appendReset(nil, sampleReset), appendDenial(nil, sampleDenial)))
	f.Add([]byte{})
	f.Add(append([]byte{1}, appendDenial(nil, sampleDenial)...))
	f.Add(appendPacket(nil, h, []byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}))
	f.Add(appendPacket(nil, h, []byte{3, 2, 1, 2, 0xff}))
	g := newGossip(slog.New(slog.DiscardHandler), 1, time.Hour)
	g.setSenders(map[uint64]string{7: "peer"}, now)
	f.Fuzz(func(t *testing.T, b []byte) {
		// What a node does with a packet: drop or apply, and relay when
		// spreading, never panic.
		g.receive(b, len(b)%2 == 0)
		h, msgs, err := splitPacket(b)
		if err != nil {
			if !errors.Is(err, errMalformedGossip) && !errors.Is(err, errUnsupportedGossip) {
				t.Fatalf("split error %v wraps neither sentinel", err)
			}
			return
		}
		h2, msgs2, err := splitPacket(appendPacket(nil, h, msgs...))
		if err != nil || h2 != h || !reflect.DeepEqual(msgs2, msgs) {
			t.Fatalf("packet %x re-encodes to %+v, %x, %v", b, h2, msgs2, err)
		}
		for _, msg := range msgs {
			m, err := decodeGossip(msg)
			if err != nil {
				if !errors.Is(err, errMalformedGossip) {
					t.Fatalf("decode error %v does not wrap errMalformedGossip", err)
				}
				continue
			}
			var again []byte
			switch m.kind {
			case kindDenial:
				again = appendDenial(nil, m.denial)
			case kindReset:
				again = appendReset(nil, m.reset)
			default:
				t.Fatalf("decoded kind %d", m.kind)
			}
			m2, err := decodeGossip(again)
			if err != nil || !reflect.DeepEqual(m, m2) {
				t.Fatalf("re-encoding %+v: got %+v, %v", m, m2, err)
			}
		}
	})
}
