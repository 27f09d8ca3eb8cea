package rlqs

import (
	"math"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	rlqsv3 "github.com/quotad/quotad/proto/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/quotad/quotad/proto/envoy/type/v3"
)

// This file is one Envoy's stream: its buckets, and the actions waiting
// to be sent to it.

// stream is one open StreamRateLimitQuotas call. Its buckets are guarded
// by the service's mutex; its outbox by its own.
type stream struct {
	// buckets are the Envoy's buckets, by name.
	buckets map[string]*bucket
	domain  string

	mu     sync.Mutex
	outbox []*rlqsv3.RateLimitQuotaResponse_BucketAction
	wake   chan struct{}
}

func newStream() *stream {
	return &stream{buckets: map[string]*bucket{}, wake: make(chan struct{}, 1)}
}

// push queues actions for the stream's sender and wakes it. It never
// blocks.
func (st *stream) push(actions ...*rlqsv3.RateLimitQuotaResponse_BucketAction) {
	if len(actions) == 0 {
		return
	}
	st.mu.Lock()
	st.outbox = append(st.outbox, actions...)
	st.mu.Unlock()
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// take empties the outbox.
func (st *stream) take() []*rlqsv3.RateLimitQuotaResponse_BucketAction {
	st.mu.Lock()
	defer st.mu.Unlock()
	out := st.outbox
	st.outbox = nil
	return out
}

// bucket is one bucket of one Envoy: its id, the rule it matched, and
// its usage. The service's mutex guards it.
type bucket struct {
	stream *stream
	id     map[string]string
	// name is the id's counter key, unique within a domain.
	name string
	to   resolved
	lim  *limit // nil unless to.limited
	// requests and seconds are the usage reported since the last round.
	requests uint64
	seconds  int64
	// demand is the bucket's requests a second over the last round it
	// reported in; +Inf until its first periodic report.
	demand float64
	// idleSince is when the bucket's reports started counting no
	// requests; zero while it has requests.
	idleSince time.Time
	// assigned is the token bucket the Envoy holds from this member; the
	// zero value: none.
	assigned bucketConfig
	// Usage in all, for metrics.
	allowed, denied uint64
	gone            bool
}

func newBucket(st *stream, id map[string]string, name string, to resolved, now time.Time) *bucket {
	return &bucket{stream: st, id: id, name: name, to: to, demand: math.Inf(1), idleSince: now}
}

// assignment is the action that assigns strategy s to the bucket for
// ttl.
func (b *bucket) assignment(s *typev3.RateLimitStrategy, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: b.id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl),
			RateLimitStrategy:    s,
		}},
	}
}

// abandonment is the action that removes the bucket from the Envoy.
func (b *bucket) abandonment() *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId:     &rlqsv3.BucketId{Bucket: b.id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}
}
