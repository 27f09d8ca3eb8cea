package guard

import "testing"

// Of goroutines that warn at once, one is let through, and none again
// until warnEvery has passed.
func TestWarnGateLetsOneWarningThrough(t *testing.T) {
	var g warnGate
	opened := make(chan bool)
	for range 8 {
		go func() { opened <- g.open() }()
	}
	n := 0
	for range 8 {
		if <-opened {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d warnings let through at once, want 1", n)
	}
	if g.open() {
		t.Fatal("a second warning let through within warnEvery")
	}
}
