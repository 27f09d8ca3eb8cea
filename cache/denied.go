package cache

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/leases"
)

// Key names one limit at the authority: a policy, the client's key within
// it, and the limit the check ran under. The cache holds at most one entry
// per policy and key; it answers a Lookup only when the Limit is equal too,
// so a request that carries a larger inline limit, or a policy whose limit
// or algorithm changed, never meets a denial made under another limit.
type Key struct {
	Policy, Key string
	Limit       algorithms.Limit
}

// Denied remembers recent denials by the authority so that a node can deny
// further checks of the same key locally until the authority's RetryAfter
// has passed, without asking the authority again.
//
// A remembered denial is only ever applied to a check it provably covers,
// and only with the wait the authority would give that check: the same Key,
// the denied cost or a larger one whose RetryAfter follows exactly from the
// denial (algorithms.Limit.RetryAfterFor), and a time before that wait
// ends. Anything else is a miss, and so is anything ristretto dropped,
// rejected or evicted; a miss only costs a call to the authority.
//
// All methods are safe for concurrent use, except Close, which must be
// called once every other call has returned.
type Denied struct {
	cfg   DeniedConfig
	seed  maphash.Seed
	c     *ristretto.Cache[uint64, *entry]
	close sync.Once
	// gen is the generation ForgetAll starts: entries of an older one are
	// misses, and ristretto reclaims them by TTL or eviction.
	gen atomic.Uint64

	// Counters, each on its own cache line: hits and misses are written by
	// every Lookup from every core, and sharing a line would make each
	// Lookup contend with all the others twice.
	hits       paddedCounter
	misses     paddedCounter
	adds       paddedCounter
	dropped    paddedCounter
	forgets    paddedCounter
	forgetAlls paddedCounter
	rejected   paddedCounter
	evicted    paddedCounter
}

type paddedCounter struct {
	atomic.Uint64
	_ [56]byte
}

// entry is one remembered denial. It is immutable once stored: a later Add
// for the same Key stores a new entry, so Lookup reads it without locks.
// Its layout is 128 bytes (a 128-byte malloc size class); entryBytes
// charges it.
type entry struct {
	// key is the full Key, with strings owned by the entry, so that a hash
	// collision between two Keys is detected and answered as a miss.
	key Key
	// cost is the denied cost, >= 1: the smallest the denial covers.
	cost int64
	// addedMs and untilMs bound the denial on the caller's clock: checks
	// at addedMs <= now < untilMs are denied.
	addedMs, untilMs int64
	// limit and remaining are the authority's Decision fields at addedMs.
	limit, remaining int64
	// resetAfter and retryAfter are the authority's waits at addedMs.
	resetAfter, retryAfter time.Duration
	// gen is the cache's generation when the entry was added.
	gen uint64
}

// DeniedStats is a snapshot of a Denied cache's counters. Counts are totals
// since NewDenied; they are read one by one, so a snapshot taken during
// concurrent use need not be consistent across fields.
type DeniedStats struct {
	// Hits is the number of Lookups that found a denial covering the check.
	Hits uint64
	// Misses is the number of Lookups that did not: no entry, an expired
	// one, a smaller cost than the denied one, a larger one whose wait the
	// denial does not determine, or a hash collision.
	Misses uint64
	// Adds is the number of Add calls that were handed to ristretto, that is
	// Add calls for a denial with a positive RetryAfter (of at least 1 ms).
	// A handed-over entry may still be dropped, rejected or evicted.
	Adds uint64
	// Dropped is the number of those Adds that ristretto dropped at once
	// because its write buffer was full (or the cache was closed).
	Dropped uint64
	// Rejected is the number of Adds that ristretto's admission policy
	// turned away (the new key looked colder than the ones it would evict),
	// plus the rare Add that met a not yet applied Add of the same Key.
	Rejected uint64
	// Evicted is the number of entries removed by ristretto to make room or
	// because their TTL passed; Close evicts all remaining entries.
	Evicted uint64
	// Forgets is the number of Forget calls; ForgetAlls the number of
	// ForgetAll calls.
	Forgets, ForgetAlls uint64
	// Cost is what the entries ristretto currently holds are charged:
	// entries when the cache is sized by MaxEntries, estimated bytes when by
	// MaxBytes. Expired entries count until ristretto's periodic cleanup
	// (every few seconds) removes them.
	Cost int64
	// MaxCost is the budget Cost is held to: MaxEntries or MaxBytes.
	MaxCost int64
}

// bufferItems is ristretto's BufferItems, the length of its batches of
// recorded accesses; 64 is its documented default.
const bufferItems = 64

// NewDenied returns an empty cache sized by c, with defaults applied to
// unset fields. It fails only if c is invalid. The cache runs one
// goroutine of ristretto's until Close.
func NewDenied(c DeniedConfig) (*Denied, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("new denied cache: %w", err)
	}
	c = c.withDefaults()
	d := &Denied{cfg: c, seed: maphash.MakeSeed()}
	rc, err := ristretto.NewCache(&ristretto.Config[uint64, *entry]{
		NumCounters: c.numCounters(),
		MaxCost:     c.maxCost(),
		BufferItems: bufferItems,
		// Keys are already hashes with a per-cache seed; ristretto's own
		// conflict hash would only repeat the Key comparison Lookup does.
		KeyToHash: func(h uint64) (uint64, uint64) { return h, 0 },
		// Denied charges every entry itself (entryCost), in entries or in
		// bytes that already include ristretto's bookkeeping.
		IgnoreInternalCost: true,
		OnReject:           func(*ristretto.Item[*entry]) { d.rejected.Add(1) },
		OnEvict:            func(*ristretto.Item[*entry]) { d.evicted.Add(1) },
	})
	if err != nil {
		return nil, fmt.Errorf("new denied cache: %w", err)
	}
	d.c = rc
	return d, nil
}

// Add remembers that the authority denied cost units of k at nowMs
// (milliseconds of the caller's monotonic clock, see the package doc) with
// decision dec, whose Allowed must be false: until nowMs + dec.RetryAfter,
// a Lookup of k with cost is a hit, and so is one of a larger cost until
// the wait the denial implies for it (see Lookup).
// cost 0 counts as 1, as it does at the authority. A RetryAfter below one
// millisecond (including any Allowed decision's) is not stored, nor is a
// negative cost.
//
// An entry for the same Key that is already visible is replaced, whatever
// its cost and end: the newer answer from the authority wins. Two Adds of
// one Key close enough that the first is not yet visible may keep the
// first instead (ristretto admits a new key once); both are the
// authority's answers, so either denies only what it would. Add copies
// k's strings, so the caller may reuse their memory. It does not block;
// the entry becomes visible to Lookup asynchronously (see Wait), and
// ristretto may drop or reject it.
func (c *Denied) Add(k Key, cost int64, dec algorithms.Decision, nowMs int64) {
	retryMs := dec.RetryAfter.Milliseconds()
	if dec.Allowed || retryMs <= 0 || cost < 0 {
		return
	}
	// Rounding RetryAfter down to whole milliseconds ends the denial no
	// later than the authority said.
	e := &entry{
		key:        cloneKey(k),
		cost:       max(cost, 1),
		addedMs:    nowMs,
		untilMs:    addMs(nowMs, retryMs),
		limit:      dec.Limit,
		remaining:  dec.Remaining,
		resetAfter: dec.ResetAfter,
		retryAfter: dec.RetryAfter,
		gen:        c.gen.Load(),
	}
	c.adds.Add(1)
	// The TTL lets ristretto reclaim the entry; it runs on the wall clock
	// and expires in coarse buckets, so Lookup checks untilMs itself.
	if !c.c.SetWithTTL(c.hash(k), e, c.cfg.entryCost(e.key), time.Duration(retryMs)*time.Millisecond) {
		c.dropped.Add(1)
	}
}

// Lookup reports whether a check of cost units of k at nowMs (on the
// clock of Add) is covered by a remembered denial: one for the same Key,
// for max(cost, 1) units or fewer, whose wait for this cost is known and
// has not ended. The wait for the denied cost is the authority's
// RetryAfter; for a larger cost it is k.Limit.RetryAfterFor the denial, and
// a larger cost it does not determine is a miss (only the authority can
// tell when it fits).
//
// On a hit the Decision is the remembered one as of nowMs: Allowed false,
// Limit and Remaining as the authority answered (Remaining may since have
// grown; the cached value is the conservative one), RetryAfter the time
// left until this cost's wait ends, and ResetAfter the authority's
// ResetAfter less the time elapsed since Add, but never below RetryAfter.
// On a miss it is the zero Decision.
//
// Lookup does not block and does not allocate.
func (c *Denied) Lookup(k Key, cost int64, nowMs int64) (algorithms.Decision, bool) {
	e, ok := c.c.Get(c.hash(k))
	if !ok || e == nil || e.key != k || e.gen != c.gen.Load() {
		c.misses.Add(1)
		return algorithms.Decision{}, false
	}
	retryAfter, untilMs, ok := e.waitFor(max(cost, 1))
	if !ok || nowMs >= untilMs {
		c.misses.Add(1)
		return algorithms.Decision{}, false
	}
	c.hits.Add(1)
	elapsed := time.Duration(nowMs-e.addedMs) * time.Millisecond
	// Whole milliseconds, rounded up, as every answer's waits: a denial a
	// peer gossiped carries its own clock's fractions.
	retry := leases.CeilMillis(retryAfter - elapsed)
	return algorithms.Decision{
		Allowed:    false,
		Limit:      e.limit,
		Remaining:  e.remaining,
		ResetAfter: max(leases.CeilMillis(e.resetAfter-elapsed), retry),
		RetryAfter: retry,
	}, true
}

// waitFor returns the authority's wait, as of addedMs, for a check of cost
// (>= 1) and the moment it ends, when the denial determines it.
func (e *entry) waitFor(cost int64) (retryAfter time.Duration, untilMs int64, ok bool) {
	if cost == e.cost {
		return e.retryAfter, e.untilMs, true
	}
	denied := algorithms.Decision{Limit: e.limit, Remaining: e.remaining, ResetAfter: e.resetAfter, RetryAfter: e.retryAfter}
	retryAfter, ok = e.key.Limit.RetryAfterFor(denied, e.cost, cost)
	if !ok {
		return 0, 0, false
	}
	return retryAfter, addMs(e.addedMs, retryAfter.Milliseconds()), true
}

// addMs returns nowMs + ms, saturating; the saturation only guards absurd
// clocks.
func addMs(nowMs, ms int64) int64 {
	if until := nowMs + ms; until >= nowMs {
		return until
	}
	return math.MaxInt64
}

// Forget drops the entry of k's policy and key, whatever its Limit (k.Limit
// is ignored), including one from an Add that is not yet visible; it is for
// when the authority's state was reset. It may block
// briefly while ristretto's write buffer is full.
func (c *Denied) Forget(k Key) {
	c.forgets.Add(1)
	c.c.Del(c.hash(k))
}

// ForgetAll drops every entry added before it, visible yet or not: for
// when the authority lost its state (a restarted or flushed Redis), so
// that no denial of the old state answers for the new one. It does not block; the dropped entries keep their
// memory until ristretto reclaims them (by TTL, or to make room).
func (c *Denied) ForgetAll() {
	c.forgetAlls.Add(1)
	c.gen.Add(1)
}

// Stats returns the cache's counters. It takes ristretto's policy lock
// briefly.
func (c *Denied) Stats() DeniedStats {
	maxCost := c.c.MaxCost()
	return DeniedStats{
		Hits:       c.hits.Load(),
		Misses:     c.misses.Load(),
		Adds:       c.adds.Load(),
		Dropped:    c.dropped.Load(),
		Rejected:   c.rejected.Load(),
		Evicted:    c.evicted.Load(),
		Forgets:    c.forgets.Load(),
		ForgetAlls: c.forgetAlls.Load(),
		Cost:       maxCost - c.c.RemainingCost(),
		MaxCost:    maxCost,
	}
}

// Wait blocks until every Add and Forget that returned before it was called
// has been applied, so that Lookup sees their effect (an Add may still have
// been dropped or rejected). It is for tests and for callers that must
// order a denial before telling others about it.
func (c *Denied) Wait() { c.c.Wait() }

// Close stops ristretto's goroutine and drops every entry. It must be
// called after every other call has returned; calling it again is a no-op.
// After Close, Lookup misses and Add, Forget and Wait do nothing.
func (c *Denied) Close() { c.close.Do(c.c.Close) }

// hash maps k's policy and key to ristretto's key with the cache's seed.
// The encoding (a length-prefixed policy, then the key) is injective, so
// distinct pairs collide only by chance, and a chance collision is caught
// by comparing the stored Key. The Limit is left out so that Forget needs
// none and a policy and key hold one entry.
func (c *Denied) hash(k Key) uint64 {
	var h maphash.Hash
	h.SetSeed(c.seed)
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(k.Policy)))
	h.Write(n[:])
	h.WriteString(k.Policy)
	h.WriteString(k.Key)
	return h.Sum64()
}

// cloneKey copies k's strings into one allocation owned by the entry, so
// the caller's buffers are never retained and entryCost's byte count is
// exact.
func cloneKey(k Key) Key {
	// Not k.Policy + k.Key: when one is empty, that returns the other
	// without copying it.
	var b strings.Builder
	b.Grow(len(k.Policy) + len(k.Key))
	b.WriteString(k.Policy)
	b.WriteString(k.Key)
	s := b.String()
	return Key{Policy: s[:len(k.Policy)], Key: s[len(k.Policy):], Limit: k.Limit}
}
