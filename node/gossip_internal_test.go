package node

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
)

// Internal tests of the gossip wire format: it is unexported, and what
// must hold is the decoder's contract, not a node's behaviour.

var sampleDenial = denialMsg{
	policy: "api", key: "user:42",
	limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100, Period: time.Minute, Burst: 20},
	cost:  3, retryAfter: 1500 * time.Millisecond, resetAfter: 12 * time.Second, remaining: 1,
}

var sampleReset = resetMsg{id: 0x0123456789abcdef, policy: "api", key: "user:42"}

func TestGossipRoundTrip(t *testing.T) {
	long := denialMsg{
		policy: strings.Repeat("p", MaxPolicyNameLen), key: strings.Repeat("k", 1000),
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
	if got := appendDenial(nil, sampleDenial); !bytes.Equal(got, []byte{
		1, 1, 3, 'a', 'p', 'i', 7, 'u', 's', 'e', 'r', ':', '4', '2', 4, 100, 0xe0, 0xd4, 0x03, 20, 3, 0xdc, 0x0b, 0xe0, 0x5d, 1,
	}) {
		t.Fatalf("denial encodes as %v", got)
	}
	if n := len(appendReset(nil, sampleReset)); n != 2+8+4+8 {
		t.Fatalf("reset encodes to %d bytes", n)
	}
}

func TestGossipRejectsMalformedMessages(t *testing.T) {
	denial := appendDenial(nil, sampleDenial)
	with := func(f func(*denialMsg)) []byte {
		d := sampleDenial
		f(&d)
		return appendDenial(nil, d)
	}
	cases := map[string]struct {
		msg         []byte
		unsupported bool
	}{
		"empty":             {msg: nil},
		"version only":      {msg: []byte{1}},
		"future version":    {msg: append([]byte{2}, denial[1:]...), unsupported: true},
		"version zero":      {msg: []byte{0, 1}, unsupported: true},
		"unknown kind":      {msg: []byte{1, 9}},
		"truncated denial":  {msg: denial[:len(denial)-1]},
		"trailing byte":     {msg: append(bytes.Clone(denial), 0)},
		"bad policy name":   {msg: with(func(d *denialMsg) { d.policy = "a:b" })},
		"empty key":         {msg: with(func(d *denialMsg) { d.key = "" })},
		"unknown algorithm": {msg: with(func(d *denialMsg) { d.limit.Algorithm = 99 })},
		"zero limit":        {msg: with(func(d *denialMsg) { d.limit.Limit = 0 })},
		"burst on a window": {msg: with(func(d *denialMsg) {
			d.limit = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: time.Second, Burst: 2}
		})},
		"cost zero":          {msg: with(func(d *denialMsg) { d.cost = 0 })},
		"cost over capacity": {msg: with(func(d *denialMsg) { d.cost = 21 })},
		"remaining too high": {msg: with(func(d *denialMsg) { d.remaining = 21 })},
		"key too long":       {msg: with(func(d *denialMsg) { d.key = strings.Repeat("k", MaxKeyLen+1) })},
		"length past end":    {msg: []byte{1, 1, 200, 1, 'a'}},
		"overlong varint":    {msg: append([]byte{1, 1}, bytes.Repeat([]byte{0xff}, 11)...)},
		"truncated reset id": {msg: []byte{1, 2, 0, 0, 0}},
		"reset bad policy":   {msg: appendReset(nil, resetMsg{policy: "", key: "k"})},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := decodeGossip(tc.msg)
			want := errMalformedGossip
			if tc.unsupported {
				want = errUnsupportedGossip
			}
			if !errors.Is(err, want) {
				t.Fatalf("decode %x: %v; want %v", tc.msg, err, want)
			}
		})
	}
}

// A queued denial goes out with the time it has left, and a cancelled one
// as already over.
func TestDenialBroadcastCountsDown(t *testing.T) {
	g := newGossip(nil)
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

// Queued messages go out in batch packets that fit the packet size, each
// message gossipTransmits times, and split back into the same messages.
func TestGossipBatches(t *testing.T) {
	g := newGossip(slog.New(slog.DiscardHandler))
	want := map[string]bool{}
	for i := range 30 {
		d := sampleDenial
		d.key = fmt.Sprintf("%03d-%s", i, strings.Repeat("k", 200))
		d.retryAfter = time.Hour
		g.queueDenial(d, time.Now())
		want[d.key] = true
	}
	g.queueReset("api", "reset-me")
	for round := range gossipTransmits + 1 {
		packets := g.nextPackets()
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
			msgs, err := splitBatch(pkt)
			if err != nil {
				t.Fatal(err)
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

// FuzzDecodeGossip: decoding never panics, whatever arrives; whatever
// decodes re-encodes to a message that decodes to the same thing.
func FuzzDecodeGossip(f *testing.F) {
	f.Add(appendDenial(nil, sampleDenial))
	f.Add(appendReset(nil, sampleReset))
	f.Add([]byte{})
	f.Add([]byte{1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{2, 1})
	f.Add([]byte{1, 3, 2, 1, 2, 0xff})
	g := newGossip(slog.New(slog.DiscardHandler))
	f.Fuzz(func(t *testing.T, b []byte) {
		// What a node does with a packet, batches included: drop or apply,
		// never panic.
		g.receive(b)
		m, err := decodeGossip(b)
		if err != nil {
			if !errors.Is(err, errMalformedGossip) && !errors.Is(err, errUnsupportedGossip) {
				t.Fatalf("decode error %v wraps neither sentinel", err)
			}
			return
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
	})
}
