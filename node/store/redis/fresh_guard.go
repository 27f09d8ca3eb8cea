package redis

import (
	"sync/atomic"
	"time"
)

// freshGuard stops fresh writes for a while when most of them find the
// key holding state after all. The key memory (key_memory.go) guesses
// which keys hold state, but a node that checks more keys than it
// remembers, all warm (a window's keys checked again within the window),
// guesses wrong: each wrong guess costs a plain write that writes nothing
// and then the script, more Redis work than the script alone. Counted over
// every freshGuardWindow fresh writes, more than half writing nothing
// pauses them for freshGuardPause, after which they are tried again.
type freshGuard struct {
	tried, failed atomic.Int64
	resetting     atomic.Bool
	// pausedUntil is when fresh writes are tried again, in ns since the
	// Unix epoch.
	pausedUntil atomic.Int64
}

const (
	freshGuardWindow = 512
	freshGuardPause  = time.Second
)

// allow reports whether a check at now may try a fresh write.
func (g *freshGuard) allow(now time.Time) bool { return now.UnixNano() >= g.pausedUntil.Load() }

// record counts a fresh write sent at now and whether it wrote.
func (g *freshGuard) record(wrote bool, now time.Time) {
	if !wrote {
		g.failed.Add(1)
	}
	if g.tried.Add(1) < freshGuardWindow || !g.resetting.CompareAndSwap(false, true) {
		return
	}
	tried, failed := g.tried.Swap(0), g.failed.Swap(0)
	if failed*2 > tried {
		g.pausedUntil.Store(now.Add(freshGuardPause).UnixNano())
	}
	g.resetting.Store(false)
}
