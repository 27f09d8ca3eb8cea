package guard

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The dropper passes a client's frames on unchanged but for the first
// SETTINGS acknowledgement, however the bytes arrive split.
func TestAckDropperDropsTheFirstAckOnly(t *testing.T) {
	ack := frameBytes(h2FrameSettings, 0, 0, 0)
	ack[4] = h2FlagAck
	before := append(frameBytes(h2FrameSettings, 0, 6, 's'), frameBytes(h2FrameHeaders, 1, 40, 'h')...)
	// A DATA payload of ack's own bytes must not be mistaken for one.
	after := append(frameBytes(0x0, 1, 0, 0), append(bytes.Repeat(ack, 3), frameBytes(0x0, 1, 20, 'd')...)...)
	after[2] = byte(len(ack) * 3)
	after = append(after, ack...) // a later acknowledgement passes
	in := append(append(append([]byte{}, before...), ack...), after...)
	want := append(append([]byte{}, before...), after...)

	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		var d ackDropper
		for b := in; len(b) > 0; {
			n := min(len(b), 1+rng.IntN(12))
			d.feed(b[:n])
			b = b[n:]
		}
		if !bytes.Equal(d.out, want) {
			t.Fatalf("out\n%x\nwant\n%x", d.out, want)
		}
		if !d.dropped {
			t.Fatal("the acknowledgement was not dropped")
		}
	}
}
