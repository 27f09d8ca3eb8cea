package rlqs

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/quotad/quotad/node"
	rlqsv3 "github.com/quotad/quotad/proto/envoy/service/rate_limit_quota/v3"
)

// This file is the service: its streams and the reports they bring.

// Stream is one StreamRateLimitQuotas call as the wire gives it: Recv
// blocks for the Envoy's next report (io.EOF when it closed its side);
// Send writes one response. Recv and Send are each called from one
// goroutine at a time.
type Stream interface {
	Context() context.Context
	Recv() (*rlqsv3.RateLimitQuotaUsageReports, error)
	Send(*rlqsv3.RateLimitQuotaResponse) error
}

// ErrUnknownDomain is a report naming a domain no rule configures. The
// stream ends with it (NotFound on the wire).
var ErrUnknownDomain = errors.New("unknown rlqs domain")

// ErrInvalidReport is a report that is not Envoy's (no bucket id, a domain
// that changes within the stream). The stream ends with it
// (InvalidArgument on the wire).
var ErrInvalidReport = errors.New("invalid rlqs report")

// Service answers Envoys' rate_limit_quota streams with assignments from
// the node's policies, dividing each limit among all Envoys of the
// cluster (see the package comment). Safe for concurrent use; Serve runs
// one stream, Run the rounds.
type Service struct {
	node   *node.Node
	cfg    Config
	rules  *rules
	member string
	log    *slog.Logger
	now    func() time.Time

	// stopped is closed when Run returns: every stream ends then.
	stopped chan struct{}

	// unregister ends the metrics' registration; Run calls it.
	unregister func() error

	mu      sync.Mutex
	streams map[*stream]struct{}
	limits  map[limitID]*limit
	stats   stats
	// figures are what each rule's buckets reported, in all.
	figures map[ruleID]*ruleFigures
}

// New returns the service for the rules of cfg, which must pass
// cfg.Validate(policies); policies are the node's. It serves nothing
// until Run runs the rounds. Its metrics go to mp until Run returns (nil:
// none); log may be nil.
func New(n *node.Node, cfg Config, policies []node.Policy, mp metric.MeterProvider, log *slog.Logger) (*Service, error) {
	if err := cfg.Validate(policies); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Service{
		node: n, cfg: cfg.WithDefaults(), rules: compile(cfg, policies),
		// The member's name in the published demand: a new one per
		// process, so that a restarted member is not taken for the one
		// it replaces.
		member: rand.Text(),
		log:    log, now: time.Now,
		streams: map[*stream]struct{}{}, limits: map[limitID]*limit{},
		stopped: make(chan struct{}),
		figures: map[ruleID]*ruleFigures{},
	}
	s.unregister = func() error { return nil }
	if mp != nil {
		unregister, err := s.instrument(mp)
		if err != nil {
			return nil, err
		}
		s.unregister = unregister
	}
	return s, nil
}

// Serve runs one Envoy's stream until it ends: the Envoy closed it or
// Run returned (nil), ctx or the stream's context ended, a report was refused, or a
// send failed (that error). The Envoy's buckets go with it: their shares
// return to the others from the round after next.
func (s *Service) Serve(ctx context.Context, wire Stream) error {
	st := newStream()
	s.mu.Lock()
	s.streams[st] = struct{}{}
	s.stats.streamsOpened++
	s.mu.Unlock()
	defer s.drop(st)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	received := make(chan error, 1)
	go func() {
		for {
			msg, err := wire.Recv()
			if err == nil {
				err = s.report(st, msg)
			}
			if err != nil {
				received <- err
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wire.Context().Done():
			return wire.Context().Err()
		case <-s.stopped:
			return nil
		case err := <-received:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-st.wake:
			if actions := st.take(); len(actions) > 0 {
				if err := wire.Send(&rlqsv3.RateLimitQuotaResponse{BucketAction: actions}); err != nil {
					return err
				}
			}
		}
	}
}

// drop forgets a stream that ended, and its buckets.
func (s *Service) drop(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.streams, st)
	for _, b := range st.buckets {
		s.remove(b)
	}
}

// remove forgets b. The caller holds s.mu.
func (s *Service) remove(b *bucket) {
	b.gone = true
	delete(b.stream.buckets, b.name)
	if b.lim != nil {
		delete(b.lim.buckets, b)
	}
}

// report takes one report of st: a bucket it does not know is new (its
// first report subscribes it, and is answered at once); a periodic
// report's usage counts toward the bucket's demand.
func (s *Service) report(st *stream, r *rlqsv3.RateLimitQuotaUsageReports) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.domain == "" {
		if _, ok := s.rules.domains[r.GetDomain()]; !ok {
			return fmt.Errorf("%w %q: the rate_limit_quota filter's domain must be one of the rlqs section's domains (%s)", ErrUnknownDomain, r.GetDomain(), strings.Join(s.domainNames(), ", "))
		}
		st.domain = r.GetDomain()
	} else if r.GetDomain() != st.domain {
		return fmt.Errorf("%w: domain %q after %q in one stream; one Envoy filter reports one domain", ErrInvalidReport, r.GetDomain(), st.domain)
	}
	now := s.now()
	for i, u := range r.GetBucketQuotaUsages() {
		id := u.GetBucketId().GetBucket()
		if len(id) == 0 {
			return fmt.Errorf("%w: bucket_quota_usages[%d].bucket_id: empty; Envoy's bucket_id_builder makes at least one entry", ErrInvalidReport, i)
		}
		name := counterKey(st.domain, id)
		b, ok := st.buckets[name]
		if !ok {
			to, _ := s.rules.match(st.domain, id)
			b = newBucket(st, id, name, to, now)
			st.buckets[name] = b
			s.subscribe(b)
		}
		n := u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
		f := s.figures[ruleID{st.domain, b.to.rule}]
		if f == nil {
			f = &ruleFigures{}
			s.figures[ruleID{st.domain, b.to.rule}] = f
		}
		f.allowed += u.GetNumRequestsAllowed()
		f.denied += u.GetNumRequestsDenied()
		b.allowed += u.GetNumRequestsAllowed()
		if b.lim != nil {
			b.lim.used += u.GetNumRequestsAllowed()
		}
		b.denied += u.GetNumRequestsDenied()
		if secs := u.GetTimeElapsed().GetSeconds(); secs > 0 {
			b.requests += n
			b.seconds += secs
			if b.lim != nil {
				b.lim.reportSeconds = max(b.lim.reportSeconds, secs)
			}
		}
		if n > 0 {
			b.idleSince = time.Time{}
		} else if b.idleSince.IsZero() {
			b.idleSince = now
		}
	}
	return nil
}

// subscribe starts serving a new bucket and answers it at once: an
// action's blanket rule, or for a limit a share of what this member
// still has spare this round (DENY_ALL when it has none: the bucket's
// share comes from the rounds). The caller holds s.mu.
func (s *Service) subscribe(b *bucket) {
	ttl := ttlFor(s.cfg.AssignmentInterval)
	if !b.to.limited {
		b.stream.push(b.assignment(blanket(b.to.allow), ttl))
		return
	}
	id := limitID{b.to.policy.Name, b.name}
	l, ok := s.limits[id]
	if !ok {
		l = newLimit(id, b.stream.domain, b.to.policy)
		s.limits[id] = l
	}
	b.lim = l
	l.buckets[b] = struct{}{}
	c := bucketFor(l.spare / 2)
	if !c.none() {
		l.spare -= c.rate()
		b.assigned = c
	}
	b.stream.push(b.assignment(c.strategy(), ttl))
}

func (s *Service) domainNames() []string {
	names := make([]string, 0, len(s.rules.domains))
	for n := range s.rules.domains {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
