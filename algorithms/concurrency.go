package algorithms

import (
	"fmt"
	"slices"
	"time"
)

// MaxConcurrencySlots bounds a Concurrency limit: each held slot is one
// Redis sorted-set member, as each sliding-log entry is.
const MaxConcurrencySlots = 1_000_000

// MaxSlotIDLen is the longest slot id, in bytes. Nodes make ids of 22
// bytes; the bound only keeps a client's echo of one small.
const MaxSlotIDLen = 64

// ConcurrencyState is one key's concurrency slots: at most Limit held at
// once, each alive until its expiry, Period after it was taken or last
// renewed. A slot is named by an id its taker chooses (a node chooses a
// random one), and only that id renews or releases it. A slot counts while
// expiry > now; once it has expired it is free again, whether or not its
// holder is still alive, and its id names nothing any more. The zero value
// is a fresh state (no slot held). Like every State, it is not safe for
// concurrent use.
//
// It mirrors scripts/concurrency.lua, scripts/renew_concurrency.lua and
// scripts/release_concurrency.lua (ZSET base:cc of ids scored by expiry);
// the rules are docs/algorithms.md, "Concurrency".
//
// Expired slots are dropped only when an acquire takes a slot, so that a
// denial, a cost-0 check, and a renew or release of an id that is not held
// leave the state untouched; they are skipped, never counted, meanwhile.
// Every operation is O(slots stored).
type ConcurrencyState struct {
	slots map[string]int64 // id → expiry in ms since the Unix epoch
}

// Acquire decides whether cost slots of l (0 or 1, see Limit.ValidateCost)
// are free at nowMs and, when cost is 1 and one is, takes the slot named
// id: it expires at nowMs + Period (or later, if id already names a live
// slot that expires later; the count is then unchanged). Cost 0 reports
// whether one slot is free and takes nothing.
//
// The Decision: Limit is l.Limit; Remaining the slots free afterwards;
// ResetAfter the wait until every slot held now has expired, if none is
// renewed or released (0 when none is held); RetryAfter, on a denial, the
// wait until enough of them have expired for the cost to fit, under the
// same assumption (a release frees one sooner). l must be valid and of
// algorithm Concurrency; id must not be empty when cost is 1.
func (s *ConcurrencyState) Acquire(l Limit, nowMs, cost int64, id string) Decision {
	c := max(cost, 1)
	held := s.held(nowMs)
	allowed := held+c <= l.Limit
	if allowed && cost > 0 {
		s.dropExpired(nowMs)
		if s.slots == nil {
			s.slots = make(map[string]int64)
		}
		exp := nowMs + l.PeriodMillis()
		if old, ok := s.slots[id]; ok {
			// Live: the expired ones are gone.
			exp = max(exp, old)
		} else {
			held++
		}
		s.slots[id] = exp
	}
	d := s.decision(l, nowMs, held)
	d.Allowed = allowed
	if !allowed {
		// The need-th live slot to expire frees the last slot needed;
		// held > limit only when the key's limit shrank since they were
		// taken.
		need := held + c - l.Limit
		live := s.liveExpiries(nowMs)
		slices.Sort(live)
		if need <= int64(len(live)) {
			d.RetryAfter = time.Duration(live[need-1]-nowMs) * time.Millisecond
		}
	}
	return d
}

// Renew extends the slot named id, if it is held (expiry > nowMs), to
// expire at nowMs + Period (never earlier than it already would), and
// reports whether it was. A slot that is unknown, was released or has
// expired is not brought back: Renew then writes nothing and reports false.
// The Decision describes the slots after the renew as Acquire's does;
// Allowed is the reported bool and RetryAfter is 0. l must be valid.
func (s *ConcurrencyState) Renew(l Limit, nowMs int64, id string) (Decision, bool) {
	exp, ok := s.slots[id]
	held := ok && exp > nowMs
	if held {
		s.slots[id] = max(exp, nowMs+l.PeriodMillis())
	}
	d := s.decision(l, nowMs, s.held(nowMs))
	d.Allowed = held
	return d, held
}

// Release frees the slot named id, if it is held (expiry > nowMs), and
// reports whether it was. Releasing a slot that is unknown, was already
// released or has expired frees nothing, writes nothing and reports false:
// a slot is freed at most once, so a second release can never free a slot
// someone else took meanwhile. The Decision is as Renew's. l must be
// valid.
func (s *ConcurrencyState) Release(l Limit, nowMs int64, id string) (Decision, bool) {
	exp, ok := s.slots[id]
	held := ok && exp > nowMs
	if held {
		delete(s.slots, id)
	}
	d := s.decision(l, nowMs, s.held(nowMs))
	d.Allowed = held
	return d, held
}

// held counts the live slots at nowMs.
func (s *ConcurrencyState) held(nowMs int64) int64 {
	var n int64
	for _, exp := range s.slots {
		if exp > nowMs {
			n++
		}
	}
	return n
}

// liveExpiries returns the expiries of the live slots, in no order.
func (s *ConcurrencyState) liveExpiries(nowMs int64) []int64 {
	live := make([]int64, 0, len(s.slots))
	for _, exp := range s.slots {
		if exp > nowMs {
			live = append(live, exp)
		}
	}
	return live
}

func (s *ConcurrencyState) dropExpired(nowMs int64) {
	for id, exp := range s.slots {
		if exp <= nowMs {
			delete(s.slots, id)
		}
	}
}

// decision is the Decision's Limit, Remaining and ResetAfter with held
// slots live at nowMs.
func (s *ConcurrencyState) decision(l Limit, nowMs, held int64) Decision {
	d := Decision{Limit: l.Limit, Remaining: max(0, l.Limit-held)}
	var newest int64
	for _, exp := range s.slots {
		newest = max(newest, exp)
	}
	if newest > nowMs {
		d.ResetAfter = time.Duration(newest-nowMs) * time.Millisecond
	}
	return d
}

// The concurrency scripts. Each takes the keys from Keys(Concurrency, base)
// and the arguments from SlotArgs; see docs/algorithms.md, "Concurrency".
const (
	acquireSlotFile = "scripts/concurrency.lua"
	renewSlotFile   = "scripts/renew_concurrency.lua"
	releaseSlotFile = "scripts/release_concurrency.lua"
)

// AcquireSlotScript returns the Lua source of ConcurrencyState.Acquire. It
// replies with the five integers DecodeAcquireSlotReply reads.
func AcquireSlotScript() string {
	return embedded(map[Algorithm]string{Concurrency: acquireSlotFile}, Concurrency)
}

// RenewSlotScript returns the Lua source of ConcurrencyState.Renew. It
// replies with the four integers DecodeSlotReply reads.
func RenewSlotScript() string {
	return embedded(map[Algorithm]string{Concurrency: renewSlotFile}, Concurrency)
}

// ReleaseSlotScript returns the Lua source of ConcurrencyState.Release. It
// replies with the four integers DecodeSlotReply reads, never creates the
// key and sets no TTL.
func ReleaseSlotScript() string {
	return embedded(map[Algorithm]string{Concurrency: releaseSlotFile}, Concurrency)
}

// SlotArgs returns the ARGV of a concurrency script: limit, period in ms,
// cost, now in ms (nowMs 0 makes the script read Redis TIME; only tests
// pass another value) and the slot id. Renew and release ignore cost (pass
// 0).
func SlotArgs(l Limit, id string, cost, nowMs int64) []any {
	return []any{l.Limit, l.PeriodMillis(), cost, nowArg(nowMs), id}
}

// DecodeAcquireSlotReply converts the acquire script's reply, {allowed
// (0|1), limit, remaining, reset_after_ms, retry_after_ms}, into a
// Decision. A reply of another shape, or whose values break the contract,
// is an error wrapping ErrBadReply.
func DecodeAcquireSlotReply(reply any) (Decision, error) {
	n, err := replyInts(reply, 5)
	if err != nil {
		return Decision{}, err
	}
	allowed, retryMs := n[0], n[4]
	switch {
	case allowed != 0 && allowed != 1:
		return Decision{}, fmt.Errorf("%w: allowed is %d", ErrBadReply, allowed)
	case retryMs < 0 || (allowed == 1 && retryMs != 0):
		return Decision{}, fmt.Errorf("%w: retry_after %d ms (allowed %d)", ErrBadReply, retryMs, allowed)
	}
	d, err := slotDecision(n[1], n[2], n[3])
	if err != nil {
		return Decision{}, err
	}
	d.Allowed, d.RetryAfter = allowed == 1, waitDuration(retryMs)
	return d, nil
}

// DecodeSlotReply converts the renew or release script's reply, {held
// (0|1), limit, remaining, reset_after_ms}, into a Decision (Allowed =
// held) and whether the slot was held. A reply of another shape, or whose
// values break the contract, is an error wrapping ErrBadReply.
func DecodeSlotReply(reply any) (Decision, bool, error) {
	n, err := replyInts(reply, 4)
	if err != nil {
		return Decision{}, false, err
	}
	if n[0] != 0 && n[0] != 1 {
		return Decision{}, false, fmt.Errorf("%w: held is %d", ErrBadReply, n[0])
	}
	d, err := slotDecision(n[1], n[2], n[3])
	if err != nil {
		return Decision{}, false, err
	}
	d.Allowed = n[0] == 1
	return d, d.Allowed, nil
}

func slotDecision(limit, remaining, resetMs int64) (Decision, error) {
	switch {
	case limit <= 0 || remaining < 0 || remaining > limit:
		return Decision{}, fmt.Errorf("%w: remaining %d outside [0, limit %d]", ErrBadReply, remaining, limit)
	case resetMs < 0:
		return Decision{}, fmt.Errorf("%w: reset_after %d ms", ErrBadReply, resetMs)
	}
	return Decision{Limit: limit, Remaining: remaining, ResetAfter: waitDuration(resetMs)}, nil
}
