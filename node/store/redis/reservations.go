package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
)

// Reservations (node.ReservationStore) on Redis: one script call each,
// which does the reservation's bookkeeping (its record, a key in the
// limit's hash tag) and the algorithm's own work atomically
// (algorithms.ReserveScript, algorithms.SettleScript). Both go through
// the checks' pipeline, off the batch script: a resend after a Cluster
// redirection is safe, as a redirected call never ran and a settle that
// ran twice changes nothing the second time.

// reservationScripts are the reserve and settle scripts of each algorithm.
type reservationScripts struct {
	reserve, settle map[algorithms.Algorithm]*goredis.Script
}

func newReservationScripts() reservationScripts {
	r := reservationScripts{reserve: map[algorithms.Algorithm]*goredis.Script{}, settle: map[algorithms.Algorithm]*goredis.Script{}}
	for _, a := range algorithms.Algorithms() {
		r.reserve[a] = goredis.NewScript(algorithms.ReserveScript(a))
		r.settle[a] = goredis.NewScript(algorithms.SettleScript(a))
	}
	return r
}

// all lists every script, to load.
func (r reservationScripts) all() []*goredis.Script {
	var all []*goredis.Script
	for _, a := range algorithms.Algorithms() {
		all = append(all, r.reserve[a], r.settle[a])
	}
	return all
}

// Reserve implements node.ReservationStore.
func (s *Store) Reserve(ctx context.Context, base string, l algorithms.Limit, cost int64, id string, lifetime time.Duration) (algorithms.Decision, error) {
	sc := s.reservations.reserve[l.Algorithm]
	if sc == nil {
		return algorithms.Decision{}, fmt.Errorf("redis reserve: %w %d", algorithms.ErrUnknownAlgorithm, int(l.Algorithm))
	}
	keys := append(algorithms.ScriptKeys(l, base, s.clock.nowMs()), algorithms.ReservationKey(base, id))
	reply, err := s.checkPipe.run(ctx, s.cfg.Timeout, sc, nil, keys, algorithms.ReserveArgs(l, cost, lifetime, 0), nil)
	if err != nil {
		return algorithms.Decision{}, fmt.Errorf("redis reserve %s: %w", l.Algorithm, err)
	}
	d, _, err := algorithms.DecodeAcquireReply(reply)
	if err != nil {
		return algorithms.Decision{}, fmt.Errorf("redis reserve %s: %w", l.Algorithm, err)
	}
	return d, nil
}

// Settle implements node.ReservationStore. Off the check path, it may
// wait as long as a release does.
func (s *Store) Settle(ctx context.Context, base string, l algorithms.Limit, id string, actual int64) (algorithms.Settlement, error) {
	sc := s.reservations.settle[l.Algorithm]
	if sc == nil {
		return algorithms.Settlement{}, fmt.Errorf("redis settle: %w %d", algorithms.ErrUnknownAlgorithm, int(l.Algorithm))
	}
	timeout := s.cfg.Timeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(max(time.Until(d), s.cfg.Timeout), s.cfg.netTimeout())
	}
	keys := append(algorithms.ScriptKeys(l, base, s.clock.nowMs()), algorithms.ReservationKey(base, id))
	reply, err := s.checkPipe.run(ctx, timeout, sc, nil, keys, algorithms.SettleArgs(l, actual, 0), nil)
	if err != nil {
		return algorithms.Settlement{}, fmt.Errorf("redis settle %s: %w", l.Algorithm, err)
	}
	out, err := algorithms.DecodeSettleReply(reply)
	if err != nil {
		return algorithms.Settlement{}, fmt.Errorf("redis settle %s: %w", l.Algorithm, err)
	}
	return out, nil
}
