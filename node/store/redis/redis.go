package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// This file is the Redis store: its Config, New, which connects and loads
// the scripts, and the node.Store calls over the pipelines.

// DefaultTimeout is Config.Timeout's default: long enough for a
// loaded Redis's round trip, short enough that a check never waits long on
// a sick one (the circuit breaker then stops the waiting altogether).
const DefaultTimeout = 50 * time.Millisecond

// DefaultConnectTimeout is Config.ConnectTimeout's default: a new
// connection to a Redis 100ms away, TLS included, fits several times over.
const DefaultConnectTimeout = time.Second

// Store runs the algorithms' Lua scripts on Redis, the authority shared
// by every node. Script calls are pipelined (see redis_pipeline.go). Safe
// for concurrent use.
type Store struct {
	// client runs checks and resets. releases runs releases: on Redis
	// Cluster it is a second client that never resends a command (see
	// newClients); otherwise it is client.
	client, releases goredis.UniversalClient
	cfg              Config
	describe         string
	check            map[algorithms.Algorithm]*goredis.Script
	// batch decides several checks of one algorithm in one call.
	batch   map[algorithms.Algorithm]*goredis.Script
	release map[algorithms.Algorithm]*goredis.Script
	slots   slotScripts
	// reservations are the reserve and settle scripts (reservations.go).
	reservations reservationScripts
	checkPipe    *pipeline
	// bulkPipe runs the checks made for a batch's items
	// (node.AcquireRequest.Bulk):
	// a CheckBatch of many cold keys keeps its pipeline's round trips
	// full, and a single check queued behind them would wait for one to
	// come back and then ride in the next, behind the items in it.
	bulkPipe    *pipeline
	releasePipe *pipeline
	// known remembers the keys seen holding state, for Acquire to choose
	// between a fresh write and the script; fresh pauses fresh writes
	// while most of them find state all the same.
	known *keyMemory
	fresh freshGuard
	// clock estimates Redis's clock for the fixed window's plain
	// commands (windows.go), sampled every clockSampleEvery until stop.
	clock *redisClock
	stop  chan struct{}
	// live watches the clients' connections, to tell a late Redis from an
	// overloaded node (liveness.go).
	live *liveness
	// db traces and measures Acquire and Release once the node has
	// instrumented the store (telemetry.go); nil: not instrumented.
	db     *dbTelemetry
	closed sync.Once
}

// New connects to Redis, checks that it answers, loads every
// script on every primary and opens the connections the pipelines use (so
// the first checks pay neither for EVAL nor for a new connection). It
// fails when Redis is unreachable: a node should not start against an
// authority it cannot reach.
func New(ctx context.Context, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	client, releases, describe, err := newClients(cfg)
	if err != nil {
		return nil, err
	}
	s := &Store{
		client:       client,
		releases:     releases,
		cfg:          cfg,
		describe:     describe,
		check:        make(map[algorithms.Algorithm]*goredis.Script),
		batch:        make(map[algorithms.Algorithm]*goredis.Script),
		release:      make(map[algorithms.Algorithm]*goredis.Script),
		slots:        newSlotScripts(),
		reservations: newReservationScripts(),
		known:        newKeyMemory(),
		live:         newLiveness(),
		clock:        newRedisClock(),
		stop:         make(chan struct{}),
	}
	// Before the first command, so that every connection is watched.
	s.live.watch(client)
	if releases != client {
		s.live.watch(releases)
	}
	for _, a := range algorithms.Algorithms() {
		s.check[a] = goredis.NewScript(algorithms.CheckScript(a))
		s.batch[a] = goredis.NewScript(algorithms.BatchCheckScript(a))
		s.release[a] = goredis.NewScript(algorithms.ReleaseScript(a))
	}
	if err := s.loadScripts(ctx); err != nil {
		err = explainTLS(err, s.client, cfg.ConnectTimeout)
		s.closeClients()
		return nil, err
	}
	// Open the pipelines' connections now rather than under the first
	// checks' deadlines.
	_ = s.Ping(ctx) // the scripts just loaded: Redis answers
	// Batches go through the client that never resends (see
	// redis_pipeline.go for why, on Redis Cluster); checks a slot move
	// redirected are resent through the one that follows redirections.
	// Releases that meet a slot move fail (see newClients).
	s.checkPipe = newPipeline(releases, client, s.live, cfg.Timeout, cfg.netTimeout(), cfg.BatchWindow, s.loadScripts)
	s.bulkPipe = newPipeline(releases, client, s.live, cfg.Timeout, cfg.netTimeout(), cfg.BatchWindow, s.loadScripts)
	s.bulkPipe.wakeChunk = bulkWakeChunk
	s.releasePipe = newPipeline(releases, nil, s.live, cfg.Timeout, cfg.netTimeout(), 0, s.loadScripts)
	// Two samples that agree make an estimate to use (redisClock).
	for range 2 {
		_ = s.clock.sample(ctx, s.client)
	}
	go s.sampleClock()
	return s, nil
}

// sampleClock renews the estimate of Redis's clock until the store closes.
func (s *Store) sampleClock() {
	tick := time.NewTicker(clockSampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.netTimeout())
			_ = s.clock.sample(ctx, s.client)
			cancel()
		}
	}
}

// loadScripts loads every script into Redis's script cache: on Redis
// Cluster, into every node's.
func (s *Store) loadScripts(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, scripts := range []map[algorithms.Algorithm]*goredis.Script{s.check, s.batch, s.release} {
		for a, sc := range scripts {
			if err := sc.Load(ctx, s.client).Err(); err != nil {
				return fmt.Errorf("load scripts on %s (%s failed first): %w", s.describe, a, err)
			}
		}
	}
	for _, sc := range s.slots.all() {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("load scripts on %s (%s failed first): %w", s.describe, algorithms.Concurrency, err)
		}
	}
	if err := shareScript.Load(ctx, s.client).Err(); err != nil {
		return fmt.Errorf("load scripts on %s (the share script failed): %w", s.describe, err)
	}
	for _, sc := range s.reservations.all() {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("load scripts on %s (a reservation script failed first): %w", s.describe, err)
		}
	}
	return nil
}

// acquire is Acquire (telemetry.go) without its telemetry; span is the
// call's own span, or nil. A call that fails before its reply
// came (its deadline passed, or ctx ended) and whose reply comes later
// hands what it took to r.Late, if any.
//
// A window algorithm's check far from the window's edge is plain
// commands on the window's own keys, whatever they hold (acquireWindow,
// windows.go).
//
// A check of a key this node does not remember holding state, whose
// algorithm can write a fresh state without the script
// (algorithms.Fresh), first tries that: one plain SET ... NX, which
// costs Redis less than half of what the script call does. Only if the key
// holds state after all does the check go to the script, within what is
// left of the same timeout. A wrong guess costs the check a second round
// trip, so the SET is tried only while round trips are short enough for
// two to fit in the timeout with room to spare (pipeline.roomForTwo): on a
// Redis some way off every check goes straight to the script, which decides
// a key with no state as well, in one round trip.
func (s *Store) acquire(ctx context.Context, r node.AcquireRequest, span trace.Span) (algorithms.Decision, algorithms.Grant, error) {
	l, cost, want := r.Limit, r.Cost, r.Want
	sc := s.check[l.Algorithm]
	if sc == nil {
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check: %w %d", algorithms.ErrUnknownAlgorithm, int(l.Algorithm))
	}
	pipe := s.checkPipe
	if r.Bulk {
		pipe = s.bulkPipe
	}
	keys := algorithms.ScriptKeys(l, r.Base, s.clock.nowMs())
	late := r.Late
	start := time.Now()
	timeout := s.cfg.Timeout
	if algorithms.HasWindowKeys(l.Algorithm) {
		d, g, handled, err := s.acquireWindow(ctx, pipe, r, algorithms.Keys(l.Algorithm, r.Base)[0], timeout, span)
		if err != nil {
			return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check %s: %w", l.Algorithm, err)
		}
		if handled {
			return d, g, nil
		}
		if timeout -= time.Since(start); timeout <= 0 {
			return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check %s: %w", l.Algorithm, pipe.missed())
		}
	}
	// A charge within the capacity decides a key with no state as a check
	// does (it fits); one above it is denied and must go to the script to
	// be recorded, and Fresh would not write it.
	if (!r.Charge || cost <= l.Capacity()) && !s.known.holds(keys[0], start) && s.fresh.allow(start) && pipe.roomForTwo(timeout) {
		// A sliding log's lease, held until its end, is the script's to
		// decide (algorithms.Fresh decides a plain check).
		leaseOfLog := l.Algorithm == algorithms.SlidingWindowLog && want > cost && r.Hold > 0
		if fw, ok := algorithms.Fresh(l, cost, want); ok && !leaseOfLog {
			// Remembered before it is sent: checks of the key that come
			// meanwhile go to the script, queued after this write, rather
			// than all trying a fresh write of their own that only one
			// can make.
			s.known.note(keys[0], start, fw.TTLMillis)
			wrote, err := s.writeFresh(ctx, pipe, algorithms.FreshKey(l.Algorithm, keys), fw, late)
			if err != nil {
				return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check %s: %w", l.Algorithm, err)
			}
			s.fresh.record(wrote, start)
			if wrote {
				// As after a script reply (below): the state lives its TTL
				// from about now, and a key checked again soon after is
				// likely hot. The note made before sending counted the TTL
				// from before the round trip, which a state that lives a few
				// ms (a high rate, a small cost) outlives by that trip.
				s.known.note(keys[0], time.Now(), fw.TTLMillis+knownMargin.Milliseconds())
				markFreshWrite(span)
				return fw.Decision, fw.Grant, nil
			}
			if timeout -= time.Since(start); timeout <= 0 {
				// Redis answered the write; whether it or the node was late
				// is the pipeline's verdict for a missed deadline.
				return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check %s: %w", l.Algorithm, pipe.missed())
			}
		}
	}
	var lateReply func(any)
	if late != nil {
		lateReply = func(reply any) {
			if _, g, err := algorithms.DecodeAcquireReply(reply); err == nil && g.Units > 0 {
				late(g)
			}
		}
	}
	args := algorithms.AcquireArgs(l, cost, want, r.Hold, 0)
	if r.Charge {
		args = algorithms.ChargeArgs(l, cost, want, r.Hold, 0)
	}
	reply, err := pipe.run(ctx, timeout, sc, s.batch[l.Algorithm], keys, args, lateReply)
	if err != nil {
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check %s: %w", l.Algorithm, err)
	}
	d, g, err := algorithms.DecodeAcquireReply(reply)
	if err != nil {
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("redis check %s: %w", l.Algorithm, err)
	}
	if algorithms.HasFreshForm(l.Algorithm) {
		// Each of these algorithms keeps its key until it would read as
		// fresh again: reset_after from now. A key checked again soon after
		// that is likely hot, its TTL kept alive by checks elsewhere or by
		// the next one here: guessing it gone would cost its check a second
		// round trip, so it is remembered knownMargin longer.
		s.known.note(keys[0], time.Now(), d.ResetAfter.Milliseconds()+knownMargin.Milliseconds())
	}
	return d, g, nil
}

// knownMargin is how long past its reset_after a key read by the script
// is still taken to hold state (Acquire).
const knownMargin = 100 * time.Millisecond

// writeFresh sends fw's SET ... PX ... NX for key and reports whether it
// wrote (the key held nothing). late, if not nil, is given fw's grant if
// the write's reply comes after the caller left and says it wrote.
func (s *Store) writeFresh(ctx context.Context, pipe *pipeline, key string, fw algorithms.FreshWrite, late func(algorithms.Grant)) (bool, error) {
	var lateReply func(any)
	if late != nil && fw.Grant.Units > 0 {
		lateReply = func(reply any) {
			if reply == "OK" {
				late(fw.Grant)
			}
		}
	}
	reply, err := pipe.runPlain(ctx, s.cfg.Timeout, lateReply, key, "set", key, fw.Value, "px", fw.TTLMillis, "nx")
	switch {
	case errors.Is(err, goredis.Nil):
		return false, nil
	case err != nil:
		return false, err
	case reply != "OK":
		return false, fmt.Errorf("%w: SET NX replied %v", algorithms.ErrBadReply, reply)
	}
	return true, nil
}

// giveBack is Release (telemetry.go) without its telemetry. It waits for
// its reply until ctx's deadline, if ctx has one, within Timeout and
// ConnectTimeout + Timeout:
// releases are off the check path (a lease or batch giving back, a late
// take), no caller's latency rides on them, and a release that fails
// leaves its units spent, so on a busy node it is worth waiting for.
func (s *Store) giveBack(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	sc := s.release[l.Algorithm]
	if sc == nil {
		return 0, fmt.Errorf("redis release: %w %d", algorithms.ErrUnknownAlgorithm, int(l.Algorithm))
	}
	timeout := s.cfg.Timeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(max(time.Until(d), s.cfg.Timeout), s.cfg.netTimeout())
	}
	reply, err := s.releasePipe.run(ctx, timeout, sc, nil, algorithms.ReleaseKeys(l, base, g), algorithms.ReleaseArgs(l, units, g, 0), nil)
	if err != nil {
		return 0, fmt.Errorf("redis release %s: %w", l.Algorithm, err)
	}
	returned, err := algorithms.DecodeReleaseReply(reply)
	if err != nil {
		return 0, fmt.Errorf("redis release %s: %w", l.Algorithm, err)
	}
	return returned, nil
}

// CallTimeout is Config.Timeout: how long each call may take as its
// caller sees it.
func (s *Store) CallTimeout() time.Duration { return s.cfg.Timeout }

// Remote implements node.Store: every call is a network round trip.
func (s *Store) Remote() bool { return true }

// ScriptCalls reports how many EVALSHAs the store sent (retries after
// NOSCRIPT and Cluster redirections not counted): fewer than the checks
// and releases it was asked for when batch script calls decided several
// checks.
func (s *Store) ScriptCalls() int64 {
	return s.checkPipe.scripts.Load() + s.bulkPipe.scripts.Load() + s.releasePipe.scripts.Load()
}

// PlainCalls reports how many checks the store sent as plain commands
// instead of a script: SETs of a fresh state (algorithms.Fresh), whether
// or not they wrote, and the window algorithms' checks
// (algorithms.WindowIncrement).
func (s *Store) PlainCalls() int64 {
	return s.checkPipe.plain.Load() + s.bulkPipe.plain.Load()
}

// RoundTrips reports how many pipelines of script calls the store sent
// (resends not counted): the network round trips that ScriptCalls shared.
func (s *Store) RoundTrips() int64 {
	return s.checkPipe.roundTrips.Load() + s.bulkPipe.roundTrips.Load() + s.releasePipe.roundTrips.Load()
}

// resetScanCount is how many keys each SCAN step of ResetInline visits: a
// step blocks Redis for well under a millisecond.
const resetScanCount = 1000

// Describe implements node.Store.
func (s *Store) Describe() string { return s.describe }

// Close implements node.Store: queued calls fail, then the connections close.
// Calls after the first return nil.
func (s *Store) Close() error {
	var err error
	s.closed.Do(func() {
		close(s.stop)
		s.checkPipe.close()
		s.bulkPipe.close()
		s.releasePipe.close()
		err = s.closeClients()
	})
	return err
}

func (s *Store) closeClients() error {
	s.live.close()
	err := s.client.Close()
	if s.releases != s.client {
		err = errors.Join(err, s.releases.Close())
	}
	return err
}

// warmConns is how many connections Ping readies: one for each round trip
// the check pipeline may have in flight at once (releases are rarer).
const warmConns = pipeliners

// Ping implements node.Store: PING is answered within ConnectTimeout + Timeout
// (time to open a connection and make one call, so a Redis that is alive
// but slower than Timeout passes), on Redis Cluster by every primary. Once
// it is, Ping readies warmConns connections in all the same way, best
// effort, and they stay open: the calls after a probe that closed the
// circuit breaker, or after New, then do not each pay for a new
// connection within their own deadline. A Redis that does not answer costs
// one connection attempt per Ping.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.netTimeout())
	defer cancel()
	if err := s.pingOnce(ctx); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	var wg sync.WaitGroup
	for range warmConns - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.pingOnce(ctx) // a connection not readied now is opened by its first call
		}()
	}
	wg.Wait()
	return nil
}

// pingOnce sends one PING to every primary through the client the
// pipelines send batches with.
func (s *Store) pingOnce(ctx context.Context) error {
	if cc, ok := s.releases.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return c.Ping(ctx).Err() })
	}
	return s.releases.Ping(ctx).Err()
}
