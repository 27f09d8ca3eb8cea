package redis

import (
	"testing"
	"time"
)

// More than half of a window's fresh writes writing nothing pauses them
// for freshGuardPause; half or fewer does not; after the pause they are
// tried again.
func TestFreshGuardPausesWhenMostGuessesAreWrong(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var g freshGuard
	for i := range freshGuardWindow {
		g.record(i%2 == 0, now) // half write
	}
	if !g.allow(now) {
		t.Fatal("paused after half the fresh writes wrote")
	}
	for i := range freshGuardWindow {
		g.record(i%4 == 0, now) // a quarter write
	}
	if g.allow(now) || g.allow(now.Add(freshGuardPause-time.Millisecond)) {
		t.Fatal("not paused after three quarters of the fresh writes wrote nothing")
	}
	if !g.allow(now.Add(freshGuardPause)) {
		t.Fatal("still paused after freshGuardPause")
	}
}
