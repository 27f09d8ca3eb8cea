package memcache

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// Store is the memcached store (node.Store, node.AlgorithmStore,
// node.LimitResetter). It is safe for concurrent use.
type Store struct {
	cfg    Config
	client *client
	closed atomic.Bool
	// stopRefresh ends the SRV refresh; nil without one.
	stopRefresh context.CancelFunc
	refreshDone chan struct{}
}

// New returns a store on the servers of c, without connecting: the first
// call, or Ping, dials. With c.SRV it looks the record up first, within
// ctx, and fails if it cannot. c must pass Validate.
func New(ctx context.Context, c Config) (*Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	addrs := c.Addrs
	if c.SRV != "" {
		lctx, cancel := context.WithTimeout(ctx, srvLookupTimeout)
		defer cancel()
		var err error
		if addrs, err = lookupServers(lctx, c.Resolver, c.SRV); err != nil {
			return nil, err
		}
	}
	s := &Store{cfg: c, client: newClient(c, addrs)}
	if c.SRV != "" && c.SRVRefresh > 0 {
		rctx, cancel := context.WithCancel(context.Background())
		s.stopRefresh, s.refreshDone = cancel, make(chan struct{})
		go func() { defer close(s.refreshDone); refreshServers(rctx, c, s.client) }()
	}
	return s, nil
}

// Keeps implements node.AlgorithmStore: fixed windows only, as
// envoyproxy/ratelimit's memcache backend.
func (s *Store) Keeps(a algorithms.Algorithm) error {
	if a == algorithms.FixedWindow {
		return nil
	}
	return fmt.Errorf("%w: %s; memcache keeps fixed windows only (fixed_window): choose fixed_window, or use Redis (--redis) for %s", node.ErrAlgorithmNotKept, a, a)
}

// Acquire implements node.Store for a fixed window, as
// algorithms.FixedWindowState decides it, with the window's counter in
// memcached (package doc). A cost of 0 reads the counter and writes
// nothing. It never calls r.Late: a reply that comes too late is not read.
func (s *Store) Acquire(ctx context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	if err := s.Keeps(r.Limit.Algorithm); err != nil {
		return algorithms.Decision{}, algorithms.Grant{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	lim, p := r.Limit.Limit, r.Limit.PeriodMillis()
	now := s.cfg.Now().UnixMilli()
	w := now - now%p
	left := time.Duration(w+p-now) * time.Millisecond
	key := windowKey(r.Base, w)

	if r.Cost == 0 {
		used, _, err := s.client.get(ctx, key)
		if err != nil {
			return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("memcache get: %w", err)
		}
		return decision(used+1 <= lim, lim, used, left), algorithms.Grant{}, nil
	}
	want := max(r.Want, r.Cost)
	after, err := s.count(ctx, key, want, expiry(now, w+p))
	if err != nil {
		return algorithms.Decision{}, algorithms.Grant{}, err
	}
	before := after - want
	var keep int64 // of want, the units that stay counted
	allowed := before+r.Cost <= lim
	switch {
	case allowed:
		keep = min(want, lim-before) // a lease takes what fits
	case r.Charge:
		keep = r.Cost // counted all the same, as upstream's INCR counts it
	}
	if give := want - keep; give > 0 {
		// Given back even when the caller has left: a denial left counted
		// would deny others until the window ends.
		gctx, gcancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
		// Should it fail, the check's answer stands all the same: the
		// window counts give units too many until it ends, which denies
		// sooner, never admits more.
		_, _, _ = s.client.incr(gctx, "decr", key, give)
		gcancel()
	}
	used := after - (want - keep)
	var g algorithms.Grant
	if allowed {
		g = algorithms.Grant{Units: keep, UseWithin: left, Ref: w}
	}
	return decision(allowed, lim, used, left), g, nil
}

// count adds units to key's counter and returns its value after: INCR,
// then ADD with exptime when the counter is missing, then INCR again when
// another ADD came first.
func (s *Store) count(ctx context.Context, key string, units, exptime int64) (int64, error) {
	after, found, err := s.client.incr(ctx, "incr", key, units)
	if err != nil {
		return 0, fmt.Errorf("memcache incr: %w", err)
	}
	if found {
		return after, nil
	}
	stored, err := s.client.add(ctx, key, units, exptime)
	if err != nil {
		return 0, fmt.Errorf("memcache add: %w", err)
	}
	if stored {
		return units, nil
	}
	after, found, err = s.client.incr(ctx, "incr", key, units)
	if err != nil {
		return 0, fmt.Errorf("memcache incr: %w", err)
	}
	if !found {
		// Added and gone at once: evicted, or deleted by a reset.
		return 0, fmt.Errorf("memcache incr: %s vanished after it was added; memcached may be out of memory", key)
	}
	return after, nil
}

// decision is the fixed window's decision with used units spent in a
// window that has left to run.
func decision(allowed bool, lim, used int64, left time.Duration) algorithms.Decision {
	d := algorithms.Decision{Allowed: allowed, Limit: lim, Remaining: max(0, lim-used)}
	if used > 0 {
		d.ResetAfter = left
	}
	if !allowed {
		d.RetryAfter = left
	}
	return d
}

// Release implements node.Store: up to units of grant g go back to the
// window they were taken in, while it is the current one (DECR, never
// below 0); once it has ended they are gone with it.
func (s *Store) Release(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	if err := s.Keeps(l.Algorithm); err != nil {
		return 0, err
	}
	u := min(units, g.Units, l.Capacity())
	p := l.PeriodMillis()
	now := s.cfg.Now().UnixMilli()
	if u <= 0 || now-now%p != g.Ref {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	_, found, err := s.client.incr(ctx, "decr", windowKey(base, g.Ref), u)
	if err != nil {
		return 0, fmt.Errorf("memcache decr: %w", err)
	}
	if !found {
		return 0, nil
	}
	return u, nil
}

// Remote implements node.Store: memcached is shared by the nodes.
func (s *Store) Remote() bool { return true }

// CallTimeout is Config.Timeout: how long a check waits for another's
// call on its key (node's callTimeouter).
func (s *Store) CallTimeout() time.Duration { return s.cfg.Timeout }

// Ping implements node.Store: every server answers "version" within ten
// times the call timeout (time to dial).
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*s.cfg.Timeout)
	defer cancel()
	if err := s.client.version(ctx); err != nil {
		return fmt.Errorf("memcache ping: %w", err)
	}
	return nil
}

// Describe implements node.Store: "memcache host:port,host:port", and
// the SRV record they were found by, if any.
func (s *Store) Describe() string {
	var addrs []string
	for _, sv := range s.client.list() {
		addrs = append(addrs, sv.addr)
	}
	d := "memcache " + strings.Join(addrs, ",")
	if s.cfg.SRV != "" {
		d += " (SRV " + s.cfg.SRV + ")"
	}
	return d
}

// Close implements node.Store: the SRV refresh stops, idle connections
// close; calls still running close theirs when done.
func (s *Store) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		if s.stopRefresh != nil {
			s.stopRefresh()
			<-s.refreshDone
		}
		s.client.close()
	}
	return nil
}
