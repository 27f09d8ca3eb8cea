package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// This file is the circuit breaker in front of a remote store: it opens
// after a run of failed calls, probes with pings, and breakerStore refuses
// calls while it is open.

// ErrBreakerOpen is what the Store calls of a remote store return, without
// trying, while the circuit breaker is open: an error between the store and
// the node, which checks answer with their policy's failure mode at once.
// Node's own methods never return it; where they report a failed store
// (Reset, slots) they wrap ErrStore, with this error's text as detail.
var ErrBreakerOpen = errors.New("store unavailable (circuit breaker open)")

// BreakerConfig configures the circuit breaker in front of a remote store.
// The zero value takes the defaults.
type BreakerConfig struct {
	// Failures is how many store calls in a row must fail for the breaker
	// to open. Default 5. Once open, calls fail at once with
	// ErrBreakerOpen instead of each waiting out the store's timeout.
	Failures int
	// ProbeEvery is how often an open breaker pings the store; the first
	// ping answered closes it. Default 250ms.
	ProbeEvery time.Duration
}

// Validate reports the first problem with c.
func (c BreakerConfig) Validate() error {
	if c.Failures < 0 {
		return fmt.Errorf("breaker failures: %w: %d must not be negative (0 means the default)", ErrInvalidConfig, c.Failures)
	}
	if c.ProbeEvery < 0 {
		return fmt.Errorf("breaker probe interval: %w: %s must not be negative (0 means the default)", ErrInvalidConfig, c.ProbeEvery)
	}
	return nil
}

func (c BreakerConfig) withDefaults() BreakerConfig {
	if c.Failures == 0 {
		c.Failures = 5
	}
	if c.ProbeEvery == 0 {
		c.ProbeEvery = 250 * time.Millisecond
	}
	return c
}

// breaker is a consecutive-failure circuit breaker. Closed, it lets every
// call through and counts failures in a row; at cfg.Failures it opens. Open,
// it refuses every call and a prober goroutine pings the store every
// cfg.ProbeEvery until one answers, which closes it. Probing with pings
// rather than with real calls means it closes even when no check arrives —
// a node a load balancer took out of rotation because it was failing closed
// would otherwise never come back. A ping is not held to a call's deadline
// (Store.Ping decides; the Redis store allows time to open a connection), so a
// store that is slower than that deadline but alive closes the breaker, and
// a run of timeouts opens it only until the next probe: a slow store
// degrades limiting rather than switching it off. A closed breaker's cost
// per call is one atomic load, and a store without failures never writes
// shared memory.
type breaker struct {
	cfg  BreakerConfig
	ping func(context.Context) error
	log  *slog.Logger
	// ctx ends the prober when the node closes.
	ctx     context.Context
	probing sync.WaitGroup

	open     atomic.Bool
	failures atomic.Int64
	opens    atomic.Int64
	errors   atomic.Int64
	// refusals counts the calls refused while open, which never reach
	// the store (and so are not in its own telemetry).
	refusals atomic.Int64
	// calls counts the calls let through to the store; overloads those
	// of them that failed with ErrOverloaded.
	calls, overloads atomic.Int64

	mu        sync.Mutex
	listeners []func(available bool)
}

func newBreaker(ctx context.Context, cfg BreakerConfig, ping func(context.Context) error, log *slog.Logger) *breaker {
	return &breaker{cfg: cfg.withDefaults(), ping: ping, log: log, ctx: ctx}
}

// allow reports ErrBreakerOpen while the breaker is open.
func (b *breaker) allow() error {
	if b.open.Load() {
		b.refusals.Add(1)
		return ErrBreakerOpen
	}
	return nil
}

// record counts the outcome of one store call made under ctx. A call whose
// own caller gave up (ctx done), or that the node did not get to in time
// (ErrOverloaded: the store was answering), says nothing about the store:
// it neither counts as a failure nor ends a run of them. The breaker
// judges the store, never the node's own queueing.
func (b *breaker) record(ctx context.Context, err error) {
	if err == nil {
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return
	}
	if errors.Is(err, ErrOverloaded) {
		b.overloads.Add(1)
		return
	}
	if ctx.Err() != nil {
		return
	}
	b.errors.Add(1)
	if b.failures.Add(1) < int64(b.cfg.Failures) || !b.open.CompareAndSwap(false, true) {
		return
	}
	b.opens.Add(1)
	b.log.Warn("store circuit breaker open: checks take their failure mode until the store answers again",
		"failures_in_a_row", b.cfg.Failures, "last_err", err, "probe_every", b.cfg.ProbeEvery)
	b.notify(false)
	b.probing.Add(1)
	go b.probe()
}

// probe pings the store until it answers, then closes the breaker.
func (b *breaker) probe() {
	defer b.probing.Done()
	t := time.NewTicker(b.cfg.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		if err := b.ping(b.ctx); err != nil {
			continue
		}
		b.failures.Store(0)
		b.open.Store(false)
		b.log.Info("store circuit breaker closed: the store answers again")
		b.notify(true)
		return
	}
}

// onChange registers fn to be called, on the goroutine that changed it,
// each time the breaker opens (false) or closes (true).
func (b *breaker) onChange(fn func(available bool)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.listeners = append(b.listeners, fn)
}

func (b *breaker) notify(available bool) {
	b.mu.Lock()
	fns := slices.Clone(b.listeners)
	b.mu.Unlock()
	for _, fn := range fns {
		fn(available)
	}
}

// wait returns once the prober, if any, has stopped; the node's ctx must be
// done.
func (b *breaker) wait() { b.probing.Wait() }

// breakerStore is a remote store behind a breaker: Acquire and Release fail
// at once while it is open. Reset, a rare operator action, always tries.
type breakerStore struct {
	Store
	b *breaker
}

func (s breakerStore) Acquire(ctx context.Context, r AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	if err := s.b.allow(); err != nil {
		return algorithms.Decision{}, algorithms.Grant{}, err
	}
	s.b.calls.Add(1)
	d, g, err := s.Store.Acquire(ctx, r)
	s.b.record(ctx, err)
	return d, g, err
}

func (s breakerStore) Release(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	if err := s.b.allow(); err != nil {
		return 0, err
	}
	s.b.calls.Add(1)
	n, err := s.Store.Release(ctx, base, l, units, g)
	s.b.record(ctx, err)
	return n, err
}
