// Package rlqssim is a simulated Envoy for tests: the client side of
// Envoy's rate_limit_quota filter as Envoy implements it
// (source/extensions/filters/http/rate_limit_quota/global_client_impl.cc),
// over a real gRPC stream to a quotad, with a real token bucket per
// bucket. It speaks quotad's wire-identical copy of the RLQS protos
// (proto/envoy), so that it can share a test binary with quotad's server.
//
// What it does as Envoy does: a bucket is created on its first request,
// decided by the no-assignment behaviour, and reported at once, alone
// (its one request, time_elapsed 0); every reporting interval one report
// carries every bucket's counts since the last, time_elapsed in whole
// seconds. A token bucket assignment starts a full bucket of max_tokens
// refilled continuously at tokens_per_fill per fill_interval (whole
// seconds); the same token bucket again keeps the bucket as it is. An
// assignment lives its time to live's whole seconds, then the bucket
// reverts to the no-assignment behaviour. An abandon action removes the
// bucket. A broken stream is opened again at the next report.
package rlqssim

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	rlqsv3 "github.com/quotad/quotad/proto/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/quotad/quotad/proto/envoy/type/v3"
)

// streamDesc is the method as grpc-go's client needs it.
var streamDesc = &grpc.StreamDesc{StreamName: "StreamRateLimitQuotas", ServerStreams: true, ClientStreams: true}

const method = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"

// Config is an Envoy's rate_limit_quota filter.
type Config struct {
	Domain string
	// ReportingInterval is the bucket settings' reporting_interval; whole
	// seconds, as Envoy counts time_elapsed.
	ReportingInterval time.Duration
	// AllowWithoutAssignment is the no_assignment_behavior: ALLOW_ALL
	// when true, else DENY_ALL.
	AllowWithoutAssignment bool
}

// Envoy is one simulated Envoy with one stream to one quotad. Safe for
// concurrent use.
type Envoy struct {
	cfg  Config
	conn *grpc.ClientConn

	mu      sync.Mutex
	buckets map[string]*Bucket
	stream  grpc.ClientStream
	cancel  context.CancelFunc
	closed  bool
	// streams counts the streams opened.
	streams int

	stop chan struct{}
	done chan struct{}
}

// Bucket is one bucket of the Envoy. Its figures are read with the
// Envoy's methods.
type Bucket struct {
	id map[string]string
	// counts since the last report
	allowed, denied uint64
	// in all
	totalAllowed, totalDenied uint64
	assignment                assignment
	// started counts the token buckets started (each full), and
	// burstTokens their max_tokens in all.
	started     int
	burstTokens uint64
	// firstShare is when the bucket first held a token bucket
	// assignment; created when it was created.
	created, firstShare time.Time
}

// assignment is what the server assigned.
type assignment struct {
	kind    int // 0 none, 1 allow all, 2 deny all, 3 token bucket
	tb      *tokenBucket
	cfg     tbConfig
	expires time.Time
}

type tbConfig struct {
	maxTokens, tokensPerFill uint32
	fillSeconds              int64
}

// tokenBucket is Envoy's token bucket: it starts full and refills
// continuously at fillRate tokens a second up to max.
type tokenBucket struct {
	max, tokens, fillRate float64
	last                  time.Time
}

func (b *tokenBucket) consume(now time.Time) bool {
	b.tokens = min(b.max, b.tokens+now.Sub(b.last).Seconds()*b.fillRate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}

// New starts an Envoy on conn, reporting every cfg.ReportingInterval
// until Close.
func New(conn *grpc.ClientConn, cfg Config) *Envoy {
	e := &Envoy{cfg: cfg, conn: conn, buckets: map[string]*Bucket{}, stop: make(chan struct{}), done: make(chan struct{})}
	go e.reportLoop()
	return e
}

// Close stops the Envoy and closes its stream, as an Envoy that goes
// away.
func (e *Envoy) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	if e.cancel != nil {
		e.cancel()
	}
	e.mu.Unlock()
	close(e.stop)
	<-e.done
}

// BreakStream closes the current stream, as a connection that broke; the
// next report opens a new one.
func (e *Envoy) BreakStream() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cancel != nil {
		e.cancel()
	}
	e.stream, e.cancel = nil, nil
}

func key(id map[string]string) string {
	keys := slices.Sorted(maps.Keys(id))
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "=" + id[k] + "|")
	}
	return b.String()
}

// Request is one request of the bucket id: whether the Envoy lets it
// through.
func (e *Envoy) Request(id map[string]string) bool {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	k := key(id)
	b, ok := e.buckets[k]
	if !ok {
		b = &Bucket{id: maps.Clone(id), created: now}
		e.buckets[k] = b
	}
	allowed := e.decide(b, now)
	if allowed {
		b.totalAllowed++
	} else {
		b.totalDenied++
	}
	if !ok {
		// The initial report: this bucket alone, its one request.
		u := &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqsv3.BucketId{Bucket: b.id}, TimeElapsed: durationpb.New(0)}
		if allowed {
			u.NumRequestsAllowed = 1
		} else {
			u.NumRequestsDenied = 1
		}
		e.sendLocked(&rlqsv3.RateLimitQuotaUsageReports{Domain: e.cfg.Domain, BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{u}})
		return allowed
	}
	if allowed {
		b.allowed++
	} else {
		b.denied++
	}
	return allowed
}

// decide applies the bucket's assignment, or the no-assignment behaviour.
func (e *Envoy) decide(b *Bucket, now time.Time) bool {
	a := b.assignment
	if a.kind != 0 && !now.Before(a.expires) {
		b.assignment = assignment{}
		a = assignment{}
	}
	switch a.kind {
	case 1:
		return true
	case 2:
		return false
	case 3:
		return a.tb.consume(now)
	}
	return e.cfg.AllowWithoutAssignment
}

// reportLoop sends the periodic reports.
func (e *Envoy) reportLoop() {
	defer close(e.done)
	t := time.NewTicker(e.cfg.ReportingInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		e.mu.Lock()
		r := &rlqsv3.RateLimitQuotaUsageReports{Domain: e.cfg.Domain}
		elapsed := durationpb.New(e.cfg.ReportingInterval.Truncate(time.Second))
		for _, b := range e.buckets {
			r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId: &rlqsv3.BucketId{Bucket: b.id}, TimeElapsed: elapsed,
				NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied,
			})
			b.allowed, b.denied = 0, 0
		}
		if len(r.BucketQuotaUsages) > 0 {
			e.sendLocked(r)
		}
		e.mu.Unlock()
	}
}

// sendLocked sends r on the stream, opening one if there is none. A
// failed send drops the stream; the next report opens another. The
// caller holds e.mu.
func (e *Envoy) sendLocked(r *rlqsv3.RateLimitQuotaUsageReports) {
	if e.closed {
		return
	}
	if e.stream == nil {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := e.conn.NewStream(ctx, streamDesc, method)
		if err != nil {
			cancel()
			return
		}
		e.stream, e.cancel = s, cancel
		e.streams++
		go e.receive(s)
	}
	if err := e.stream.SendMsg(r); err != nil {
		e.cancel()
		e.stream, e.cancel = nil, nil
	}
}

// receive applies the server's actions until the stream ends.
func (e *Envoy) receive(s grpc.ClientStream) {
	for {
		m := new(rlqsv3.RateLimitQuotaResponse)
		if err := s.RecvMsg(m); err != nil {
			e.mu.Lock()
			if e.stream == s {
				e.cancel()
				e.stream, e.cancel = nil, nil
			}
			e.mu.Unlock()
			return
		}
		e.apply(m)
	}
}

// apply applies one response's actions.
func (e *Envoy) apply(m *rlqsv3.RateLimitQuotaResponse) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range m.GetBucketAction() {
		k := key(a.GetBucketId().GetBucket())
		b, ok := e.buckets[k]
		if !ok {
			continue
		}
		if a.GetAbandonAction() != nil {
			delete(e.buckets, k)
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			continue
		}
		// Only the time to live's whole seconds count.
		expires := now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
		s := qa.GetRateLimitStrategy()
		switch {
		case s.GetTokenBucket() != nil:
			tb := s.GetTokenBucket()
			per := uint32(1)
			if tb.GetTokensPerFill() != nil {
				per = tb.GetTokensPerFill().GetValue()
			}
			c := tbConfig{maxTokens: tb.GetMaxTokens(), tokensPerFill: per, fillSeconds: tb.GetFillInterval().GetSeconds()}
			if c.fillSeconds <= 0 || c.maxTokens == 0 || c.tokensPerFill == 0 {
				continue // Envoy's validation refuses it
			}
			if b.assignment.kind == 3 && b.assignment.cfg == c {
				b.assignment.expires = expires
				continue
			}
			b.assignment = assignment{kind: 3, cfg: c, expires: expires, tb: &tokenBucket{
				max: float64(c.maxTokens), tokens: float64(c.maxTokens), last: now,
				fillRate: float64(c.tokensPerFill) / float64(c.fillSeconds),
			}}
			b.started++
			b.burstTokens += uint64(c.maxTokens)
			if b.firstShare.IsZero() {
				b.firstShare = now
			}
		case s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL && s.GetStrategy() != nil:
			b.assignment = assignment{kind: 1, expires: expires}
		case s.GetStrategy() != nil:
			b.assignment = assignment{kind: 2, expires: expires}
		}
	}
}

// Figures are a bucket's figures at one moment.
type Figures struct {
	Allowed, Denied uint64
	// Started counts the token buckets started, BurstTokens their
	// max_tokens in all (each started full).
	Started     int
	BurstTokens uint64
	// Rate is the refill rate of the token bucket held now, tokens a
	// second; 0 without one. Assigned reports any assignment in force.
	Rate     float64
	Tokens   float64
	Assigned bool
	// FirstShare is how long after the bucket's creation it first held
	// a token bucket; 0 if never.
	FirstShare time.Duration
	Exists     bool
}

// Bucket returns the figures of the bucket id.
func (e *Envoy) Bucket(id map[string]string) Figures {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, ok := e.buckets[key(id)]
	if !ok {
		return Figures{}
	}
	f := Figures{Allowed: b.totalAllowed, Denied: b.totalDenied, Started: b.started, BurstTokens: b.burstTokens, Exists: true}
	now := time.Now()
	if b.assignment.kind != 0 && now.Before(b.assignment.expires) {
		f.Assigned = true
		if b.assignment.kind == 3 {
			f.Rate = b.assignment.tb.fillRate
			f.Tokens = min(b.assignment.tb.max, b.assignment.tb.tokens+now.Sub(b.assignment.tb.last).Seconds()*b.assignment.tb.fillRate)
		}
	}
	if !b.firstShare.IsZero() {
		f.FirstShare = b.firstShare.Sub(b.created)
	}
	return f
}

// Streams counts the streams the Envoy opened.
func (e *Envoy) Streams() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.streams
}
