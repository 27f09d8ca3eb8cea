package leases

import (
	"sync/atomic"
	"time"
)

// MinChecks is the smallest lease worth taking, in checks of the asking
// cost: a lease costs a call to take and often one to give back.
const MinChecks = 4

// Demand is a key's demand as its holder sees it, in units per second,
// which sizes the key's next lease. Checks add to Asked as they come;
// Rate folds what they asked into samples at least a horizon long,
// smoothed. The zero value starts a sample at clock 0; Start starts it
// at another time. Asked is safe for concurrent use; Rate and Start need
// the holder's lock of the key.
type Demand struct {
	// Asked counts the units checks asked for since the sample began.
	Asked atomic.Int64
	// LastUsed is the holder's clock (ns) of a recent check: a key idle
	// long enough is forgotten.
	LastUsed    atomic.Int64
	sampleStart int64   // holder's clock (ns) when the current sample began
	smoothed    float64 // units per second, smoothed over past samples
}

// Start begins the first sample at now (holder's clock, ns), a check's
// time.
func (d *Demand) Start(now int64) {
	d.sampleStart = now
	d.LastUsed.Store(now)
}

// Rate returns the demand in units per second as of now (holder's clock,
// ns). A sample that has lasted a horizon is folded into the smoothed
// rate (half the old rate, half the sample) and a new one starts. Until a
// sample completes, the checks seen so far bound the rate from below, so
// a key that turns hot leases within its first horizon, while two checks
// a microsecond apart never look like a hot key.
func (d *Demand) Rate(now int64, horizon time.Duration) float64 {
	asked := d.Asked.Load()
	if elapsed := now - d.sampleStart; elapsed >= int64(horizon) {
		d.Asked.Add(-asked)
		sample := float64(asked) / (float64(elapsed) / float64(time.Second))
		if d.smoothed == 0 {
			d.smoothed = sample
		} else {
			d.smoothed = 0.5*d.smoothed + 0.5*sample
		}
		d.sampleStart, asked = now, 0
	}
	return max(d.smoothed, float64(asked)/horizon.Seconds())
}

// Want is the lease to ask for at now for checks of cost: the demand over
// the horizon, at most limit; 0 when that is under MinChecks checks'
// worth (a cold key, a limit too small to hold a few checks).
func (d *Demand) Want(now int64, horizon time.Duration, cost, limit int64) int64 {
	want := min(int64(d.Rate(now, horizon)*horizon.Seconds()), limit)
	if want < MinChecks*max(cost, 1) {
		return 0
	}
	return want
}
