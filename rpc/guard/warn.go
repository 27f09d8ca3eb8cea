package guard

import (
	"sync/atomic"
	"time"
)

// This file spaces the warnings the guards log about their clients.

// warnEvery is the shortest time between two warnings of one kind: a
// flood of connections at the cap, or a client that reconnects again and
// again to be refused, is logged once every warnEvery, not per connection.
const warnEvery = 10 * time.Second

// warnGate lets one warning through every warnEvery, however many
// goroutines ask at once. The zero value lets the first through. Safe for
// concurrent use.
type warnGate struct {
	// last is the unix nanoseconds of the last warning let through.
	last atomic.Int64
}

// open reports whether a warning may be logged now; if so, the next may
// be only warnEvery later.
func (g *warnGate) open() bool {
	now := time.Now().UnixNano()
	last := g.last.Load()
	return now-last >= int64(warnEvery) && g.last.CompareAndSwap(last, now)
}
