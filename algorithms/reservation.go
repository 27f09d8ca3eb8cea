package algorithms

import (
	"fmt"
	"strings"
	"time"
)

// Reservations: a check of an estimated cost (Reserve) whose cost is made
// exact later (Settle) with what was actually used, once. docs/algorithms.md,
// "Reservations", states the rules; this file holds them for both the Lua
// scripts (ReserveScript, SettleScript) and the Go model (Reservation).

// SettleOutcome is what a settle found.
type SettleOutcome int

const (
	// NoReservation: no reservation of that id is held for the key: never
	// made, denied, or past its lifetime. Nothing changed; a reservation
	// not settled in its lifetime stays charged its estimate.
	NoReservation SettleOutcome = iota
	// Settled: the reservation was settled now, with the actual given.
	Settled
	// SettledBefore: the reservation was settled already (a retried
	// settle): nothing changed, and Recorded is the actual it was settled
	// with.
	SettledBefore
)

// String names the outcome as the API does.
func (o SettleOutcome) String() string {
	switch o {
	case Settled:
		return "settled"
	case SettledBefore:
		return "settled before"
	}
	return "no reservation"
}

// Settlement is the result of a settle.
type Settlement struct {
	Outcome SettleOutcome
	// Recorded is the actual the reservation is settled with (Settled,
	// SettledBefore); 0 otherwise.
	Recorded int64
	// Refunded is how much of estimate − actual made a difference at the
	// authority: less when the units no longer counted (the fixed window
	// they were taken in has ended, the bucket refilled meanwhile).
	Refunded int64
	// Charged is actual − estimate when positive: always counted, into
	// debt when it does not fit.
	Charged int64
	// After is a check of cost 0 after the settlement: whether one unit
	// fits now, the remaining and the waits.
	After Decision
}

// MaxReservationLifetime bounds how long a reservation may wait for its
// settle: a day, longer than any response a reservation stands for.
const MaxReservationLifetime = 24 * time.Hour

// ReservationKey is the Redis key of the reservation id of the limit
// stored under base: in base's hash tag, so in the slot of the limit's own
// keys.
func ReservationKey(base, id string) string { return base + ":rv:" + id }

// ReserveScript returns the Lua source of algorithm a's reserve script
// (scripts/reserve.lua): KEYS are Keys(a, base) and then ReservationKey,
// ARGV ReserveArgs; it replies as a check script does. "" for an invalid
// algorithm or Concurrency.
func ReserveScript(a Algorithm) string { return composed(a, "scripts/reserve.lua") }

// SettleScript returns the Lua source of algorithm a's settle script
// (scripts/settle.lua): KEYS are Keys(a, base) and then ReservationKey,
// ARGV SettleArgs; DecodeSettleReply reads its reply. "" for an invalid
// algorithm or Concurrency.
func SettleScript(a Algorithm) string { return composed(a, "scripts/settle.lua") }

// composed is the prelude, then a's check script as the function
// acquire_body and its release script as release_body, then the script
// tail, which sets the keys and args they read (the bodies' KEYS and ARGV,
// renamed) and calls them. Redis scripts cannot call one another; this
// way one script call does both a reservation's bookkeeping and the
// algorithm's own work, atomically.
func composed(a Algorithm, tail string) string {
	check, release := CheckScript(a), ReleaseScript(a)
	prelude, err1 := scriptFiles.ReadFile("scripts/prelude.lua")
	rest, err2 := scriptFiles.ReadFile(tail)
	if check == "" || release == "" || err1 != nil || err2 != nil {
		return ""
	}
	body := func(src string) string {
		src = strings.TrimPrefix(src, string(prelude))
		return strings.NewReplacer("KEYS[", "keys[", "ARGV[", "args[").Replace(src)
	}
	var b strings.Builder
	b.Write(prelude)
	b.WriteString("local keys, args = KEYS, ARGV\n")
	b.WriteString("local function acquire_body()\n" + body(check) + "\nend\n")
	b.WriteString("local function release_body()\n" + body(release) + "\nend\n")
	b.Write(rest)
	return b.String()
}

// ReserveArgs returns the ARGV of a reserve script: CheckArgs(l, estimate,
// nowMs) and the lifetime in whole ms.
func ReserveArgs(l Limit, estimate int64, lifetime time.Duration, nowMs int64) []any {
	return append(CheckArgs(l, estimate, nowMs), lifetime.Milliseconds())
}

// SettleArgs returns the ARGV of a settle script: limit, period in ms,
// capacity, actual, a, b, now in ms (nowMs 0: Redis TIME).
func SettleArgs(l Limit, actual, nowMs int64) []any {
	a, b := l.Rate()
	return []any{l.Limit, l.PeriodMillis(), l.Capacity(), actual, a, b, nowArg(nowMs)}
}

// DecodeSettleReply reads a settle script's reply, {outcome, recorded,
// refunded, charged, allowed, limit, remaining, reset_after_ms,
// retry_after_ms}. A reply of another shape is an error wrapping
// ErrBadReply.
func DecodeSettleReply(reply any) (Settlement, error) {
	n, err := replyInts(reply, 9)
	if err != nil {
		return Settlement{}, err
	}
	if n[0] < 0 || n[0] > int64(SettledBefore) || n[1] < 0 || n[2] < 0 || n[3] < 0 {
		return Settlement{}, fmt.Errorf("%w: settle outcome %d, recorded %d, refunded %d, charged %d", ErrBadReply, n[0], n[1], n[2], n[3])
	}
	d, _, err := DecodeAcquireReply([]any{n[4], n[5], n[6], n[7], n[8], int64(0), int64(0), int64(0)})
	if err != nil {
		return Settlement{}, err
	}
	return Settlement{Outcome: SettleOutcome(n[0]), Recorded: n[1], Refunded: n[2], Charged: n[3], After: d}, nil
}

// Reservation is the Go model of a reservation's record, what the memory
// store keeps per id: the estimate and the grant it took, until settled.
type Reservation struct {
	Estimate int64
	Grant    Grant
	// Settled and Actual: the reservation was settled, with Actual.
	Settled bool
	Actual  int64
}

// Settle settles r with actual against s, the state of r's limit l, at
// nowMs, as the settle script does: below the estimate it gives back the
// difference (State.Release), above it charges it (State.Charge); a
// settled r changes nothing. After is s.Check(l, nowMs, 0) in every case.
// actual must pass l.ValidateCharge.
func (r *Reservation) Settle(s State, l Limit, nowMs, actual int64) Settlement {
	var out Settlement
	switch {
	case r.Settled:
		out = Settlement{Outcome: SettledBefore, Recorded: r.Actual}
	default:
		r.Settled, r.Actual = true, actual
		out = Settlement{Outcome: Settled, Recorded: actual}
		if actual < r.Estimate {
			out.Refunded = s.Release(l, nowMs, r.Estimate-actual, r.Grant)
		} else if extra := actual - r.Estimate; extra > 0 {
			s.Charge(l, nowMs, extra, extra, 0)
			out.Charged = extra
		}
	}
	out.After = s.Check(l, nowMs, 0)
	return out
}
