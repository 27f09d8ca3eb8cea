package quotadtest

import (
	"testing"
	"time"
)

// AwayFromWindowEnd returns once at least margin is left before the current
// fixed window of length period ends. Fixed windows are aligned to multiples
// of the period since the Unix epoch (algorithms.FixedWindowState), on the
// clock of the machine the tests run on — the same clock the test's Redis
// and memory store read. A test that expects a sequence of checks to land in
// one window calls it first, so that a window turning mid-sequence (under
// load, a few seconds) cannot add a fresh budget to what it counts.
//
// It waits at most margin; a margin of period or more is a test bug.
func AwayFromWindowEnd(t testing.TB, period, margin time.Duration) {
	t.Helper()
	if period <= 0 || margin >= period {
		t.Fatalf("AwayFromWindowEnd(%v, %v): the margin must be shorter than the period", period, margin)
	}
	left := period - time.Duration(time.Now().UnixNano()%int64(period))
	if left < margin {
		t.Logf("waiting %v for the next %v window, so the checks cannot straddle two", left.Round(time.Millisecond), period)
		time.Sleep(left)
	}
}
