// Package topkeys finds, per policy, the keys denied most often over the
// last few intervals, in memory that is fixed whatever the number of
// distinct keys: a Space-Saving summary per policy and interval, a bounded
// number of policies.
//
// It is pure: no I/O and no clock. The caller adds each denial (Add) and
// says when an interval ends (Advance); quotad's node does both, with
// one-minute intervals.
package topkeys

import (
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("invalid topkeys config")

// Defaults of Config.
const (
	DefaultCounters  = 64
	DefaultTop       = 20
	DefaultIntervals = 5
	DefaultPolicies  = 100
)

// Config sizes a Tracker. The zero value takes the defaults: 64 counters,
// top 20, 5 intervals, 100 policies.
type Config struct {
	// Counters is how many keys one policy's summary of one interval
	// tracks (Space-Saving's m). A key denied more than 1/Counters of its
	// policy's denials in an interval is always among them. Default 64.
	Counters int
	// Top is how many keys Top reports per policy, at most Counters.
	// Default 20.
	Top int
	// Intervals is how many intervals a report spans: the current one and
	// the Intervals−1 before it. Default 5.
	Intervals int
	// Policies bounds the policies tracked; denials under further policy
	// names are only counted in Untracked. Default 100.
	Policies int
}

// Validate reports the first problem with c. Zero fields are valid: they
// stand for the defaults.
func (c Config) Validate() error {
	switch {
	case c.Counters < 0 || c.Top < 0 || c.Intervals < 0 || c.Policies < 0:
		return fmt.Errorf("%w: counters %d, top %d, intervals %d, policies %d must not be negative (0 means the default)",
			ErrInvalidConfig, c.Counters, c.Top, c.Intervals, c.Policies)
	case c.withDefaults().Top > c.withDefaults().Counters:
		return fmt.Errorf("%w: top %d is more than the %d counters", ErrInvalidConfig, c.withDefaults().Top, c.withDefaults().Counters)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Counters == 0 {
		c.Counters = DefaultCounters
	}
	if c.Top == 0 {
		c.Top = min(DefaultTop, c.Counters)
	}
	if c.Intervals == 0 {
		c.Intervals = DefaultIntervals
	}
	if c.Policies == 0 {
		c.Policies = DefaultPolicies
	}
	return c
}

// MaxSlots is the most keys a Tracker with this config ever holds:
// Policies × Intervals × Counters. Its memory is that many slots of fixed
// size (Size.SlotBytes each) plus the bytes of the keys in them.
func (c Config) MaxSlots() int {
	c = c.withDefaults()
	return c.Policies * c.Intervals * c.Counters
}

// Tracker counts denials per policy and key. It is safe for concurrent
// use. Add takes one policy's lock for a few dozen nanoseconds and does not
// allocate once the policy is tracked.
type Tracker struct {
	cfg  Config
	seed maphash.Seed

	epoch atomic.Uint64
	// policies is an immutable map replaced on each new policy, so that
	// Add reads it without a lock; at most cfg.Policies names are added.
	policies  atomic.Pointer[map[string]*policy]
	mu        sync.Mutex // serializes additions to policies
	full      atomic.Bool
	untracked atomic.Uint64
}

// policy is one policy's summaries, a ring indexed by epoch.
type policy struct {
	mu    sync.Mutex
	slots []summary
}

// New returns an empty Tracker. cfg is defaulted, then validated.
func New(cfg Config) (*Tracker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Tracker{cfg: cfg.withDefaults(), seed: maphash.MakeSeed()}
	m := map[string]*policy{}
	t.policies.Store(&m)
	return t, nil
}

// Add counts one denial of key under policy. Keys are kept by reference
// (Go strings are immutable), never copied.
func (t *Tracker) Add(policyName, key string) {
	p, ok := (*t.policies.Load())[policyName]
	if !ok {
		if p = t.track(policyName); p == nil {
			t.untracked.Add(1)
			return
		}
	}
	h := maphash.String(t.seed, key)
	e := t.epoch.Load()
	p.mu.Lock()
	s := &p.slots[e%uint64(len(p.slots))]
	if s.epoch != e {
		s.reset(e)
	}
	s.add(key, h)
	p.mu.Unlock()
}

// track returns the policy called name, adding it if there is room; nil
// when the tracker already holds cfg.Policies policies.
func (t *Tracker) track(name string) *policy {
	if t.full.Load() {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.policies.Load()
	if p, ok := old[name]; ok {
		return p
	}
	if len(old) >= t.cfg.Policies {
		t.full.Store(true)
		return nil
	}
	p := &policy{slots: make([]summary, t.cfg.Intervals)}
	for i := range p.slots {
		p.slots[i] = newSummary(t.cfg.Counters)
	}
	m := make(map[string]*policy, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[name] = p
	t.policies.Store(&m)
	return p
}

// Advance ends the current interval: from now on reports leave out the
// oldest one. It costs one atomic add; summaries are emptied lazily, by the
// next Add that reaches them.
func (t *Tracker) Advance() { t.epoch.Add(1) }

// Entry is one key in a report. Its true number of denials in the window
// is between Count−Error and Count.
type Entry struct {
	Key          string
	Count, Error uint64
}

// PolicyTop is one policy's report.
type PolicyTop struct {
	Policy string
	// Denials counts every denial added for the policy in the window,
	// exactly.
	Denials uint64
	// Keys are the keys denied most, most first (ties by key), at most
	// Config.Top of them.
	Keys []Entry
	// Unlisted is the most any key not in Keys may have been denied in
	// the window: 0 when every key denied is listed, else the higher of
	// the first count cut from Keys and what a key absent from the full
	// summaries may have missed. It is what Merge counts for a key another
	// report lists and this one does not.
	Unlisted uint64
}

// Report is what Top returns.
type Report struct {
	// Intervals is how many intervals the window spans (Config.Intervals),
	// the current one included.
	Intervals int
	// Policies are the tracked policies that had denials in the window,
	// sorted by name.
	Policies []PolicyTop
	// Untracked counts denials, since the tracker was made, under policies
	// beyond Config.Policies, which no report shows.
	Untracked uint64
}

// Top reports, per policy, the keys denied most in the window. Keys are
// merged across intervals: a key's Count adds its counts where it is
// tracked and, where it is not, the most it could have been denied there.
func (t *Tracker) Top() Report {
	e := t.epoch.Load()
	r := Report{Intervals: t.cfg.Intervals, Untracked: t.untracked.Load()}
	for name, p := range *t.policies.Load() {
		if top, ok := t.policyTop(name, p, e); ok {
			r.Policies = append(r.Policies, top)
		}
	}
	slices.SortFunc(r.Policies, func(a, b PolicyTop) int { return strings.Compare(a.Policy, b.Policy) })
	return r
}

// policyTop merges p's summaries of the window ending at epoch e.
func (t *Tracker) policyTop(name string, p *policy, e uint64) (PolicyTop, bool) {
	type agg struct {
		count, lower uint64
		seen         int // intervals tracking the key
	}
	type interval struct {
		minCount uint64
		keys     []string
	}
	top := PolicyTop{Policy: name}
	byKey := map[string]*agg{}
	var live []interval
	p.mu.Lock()
	for i := range p.slots {
		s := &p.slots[i]
		// A summary belongs to the window if it counts one of its
		// intervals; one Add has not reached since is older.
		if s.n == 0 || s.epoch > e || e-s.epoch >= uint64(t.cfg.Intervals) {
			continue
		}
		top.Denials += s.total
		in := interval{minCount: s.minCount(), keys: slices.Clone(s.keys[:s.n])}
		for j := range s.n {
			a := byKey[s.keys[j]]
			if a == nil {
				a = &agg{}
				byKey[s.keys[j]] = a
			}
			a.count += s.counts[j]
			a.lower += s.counts[j] - s.errs[j]
			a.seen++
		}
		live = append(live, in)
	}
	p.mu.Unlock()
	if len(live) == 0 {
		return PolicyTop{}, false
	}
	// A key absent from a full summary may still have been denied up to
	// that summary's lowest count there.
	var absentBound uint64
	for _, in := range live {
		absentBound += in.minCount
	}
	entries := make([]Entry, 0, len(byKey))
	for k, a := range byKey {
		upper := a.count + absentBound
		for _, in := range live {
			if slices.Contains(in.keys, k) {
				upper -= in.minCount
			}
		}
		entries = append(entries, Entry{Key: k, Count: upper, Error: upper - a.lower})
	}
	slices.SortFunc(entries, byCountThenKey)
	top.Unlisted = absentBound
	if len(entries) > t.cfg.Top {
		top.Unlisted = max(absentBound, entries[t.cfg.Top].Count)
	}
	top.Keys = entries[:min(len(entries), t.cfg.Top)]
	return top, true
}

// byCountThenKey orders entries most counted first, ties by key.
func byCountThenKey(a, b Entry) int {
	if a.Count != b.Count {
		if a.Count > b.Count {
			return -1
		}
		return 1
	}
	return strings.Compare(a.Key, b.Key)
}

// Size is what a Tracker holds now.
type Size struct {
	// Policies tracked; Slots allocated for keys (Policies × Intervals ×
	// Counters, never more than Config.MaxSlots); Entries of them in use;
	// KeyBytes, the bytes of the keys in use.
	Policies, Slots, Entries, KeyBytes int
}

// SlotBytes is the fixed memory of one slot: its hash, string header,
// count and error.
const SlotBytes = 8 + 16 + 8 + 8

// Size reports what t holds now. It locks each policy in turn.
func (t *Tracker) Size() Size {
	var sz Size
	for _, p := range *t.policies.Load() {
		sz.Policies++
		p.mu.Lock()
		for i := range p.slots {
			s := &p.slots[i]
			sz.Slots += len(s.counts)
			sz.Entries += s.n
			for _, k := range s.keys[:s.n] {
				sz.KeyBytes += len(k)
			}
		}
		p.mu.Unlock()
	}
	return sz
}
