package rpc

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/rpc/protoconv"
)

// This file converts between protobuf messages and node's domain types.
// Conversions from protobuf validate what only the wire can get wrong
// (enum numbers, Duration encodings, a missing period) and leave the rest to
// node.NewPolicy (algorithms.Limit.Validate), which policyResolver calls
// once, so that the rules live in one place. Errors name the field as the
// request spells it, e.g. "limit.period: ...".

// limitFromProto converts an inline limit and its failure mode, checking
// only what the wire can get wrong: the limit it returns is not validated
// yet (node.NewPolicy does that). Every error wraps an algorithms or node
// sentinel (so node.IsInvalidInput holds) and names the field with a
// "limit." prefix.
func limitFromProto(pl *quotadv1.Limit) (algorithms.Limit, node.FailureMode, error) {
	l, mode, err := limitFromProtoUnprefixed(pl)
	if err != nil {
		// The errors below and those of algorithms.Limit.Validate start with
		// the field name ("period: ..."), so this yields "limit.period: ...".
		return algorithms.Limit{}, 0, fmt.Errorf("limit.%w", err)
	}
	return l, mode, nil
}

func limitFromProtoUnprefixed(pl *quotadv1.Limit) (algorithms.Limit, node.FailureMode, error) {
	a, err := algorithmFromProto(pl.GetAlgorithm())
	if err != nil {
		return algorithms.Limit{}, 0, err
	}
	period, err := periodFromProto(pl.GetPeriod())
	if err != nil {
		return algorithms.Limit{}, 0, err
	}
	mode, err := failureModeFromProto(pl.GetOnStoreError())
	if err != nil {
		return algorithms.Limit{}, 0, err
	}
	return algorithms.Limit{Algorithm: a, Limit: pl.GetLimit(), Period: period, Burst: pl.GetBurst()}, mode, nil
}

// costFromProto returns the request's cost: 1 when omitted, as the API
// documents; 0 and negative values pass through for node to judge.
func costFromProto(req *quotadv1.CheckRequest) int64 {
	if req == nil || req.Cost == nil {
		return 1
	}
	return *req.Cost
}

// algorithmFromProto maps the API's enum to algorithms.Algorithm
// (protoconv holds the one mapping), naming the field in its error.
func algorithmFromProto(a quotadv1.Algorithm) (algorithms.Algorithm, error) {
	if alg, ok := protoconv.AlgorithmFromProto(a); ok {
		return alg, nil
	}
	// String gives the enum name, or the bare number for an unknown value.
	return 0, fmt.Errorf("algorithm: %w %s (want ALGORITHM_FIXED_WINDOW, ALGORITHM_SLIDING_WINDOW_LOG, ALGORITHM_SLIDING_WINDOW_COUNTER, ALGORITHM_TOKEN_BUCKET, ALGORITHM_LEAKY_BUCKET, ALGORITHM_GCRA or ALGORITHM_CONCURRENCY)",
		algorithms.ErrUnknownAlgorithm, a)
}

// periodFromProto converts a period. A missing or malformed Duration is an
// error here; its range and granularity are algorithms.Limit.Validate's
// business. A valid Duration beyond time.Duration's ±292 years saturates,
// which Validate then rejects as too long or too short.
func periodFromProto(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, fmt.Errorf("period: %w: missing (want e.g. \"60s\" in JSON)", algorithms.ErrInvalidPeriod)
	}
	if err := d.CheckValid(); err != nil {
		return 0, fmt.Errorf("period: %w: %v", algorithms.ErrInvalidPeriod, err)
	}
	return d.AsDuration(), nil
}

// failureModeFromProto maps the API's enum to node.FailureMode;
// UNSPECIFIED defers to the node's default.
func failureModeFromProto(m quotadv1.FailureMode) (node.FailureMode, error) {
	switch m {
	case quotadv1.FailureMode_FAILURE_MODE_UNSPECIFIED:
		return node.FailDefault, nil
	case quotadv1.FailureMode_FAILURE_MODE_OPEN:
		return node.FailOpen, nil
	case quotadv1.FailureMode_FAILURE_MODE_CLOSED:
		return node.FailClosed, nil
	}
	return 0, fmt.Errorf("on_store_error: %w %s (want FAILURE_MODE_UNSPECIFIED, FAILURE_MODE_OPEN or FAILURE_MODE_CLOSED)", node.ErrInvalidFailureMode, m)
}

// failureModeToProto is the inverse of failureModeFromProto.
func failureModeToProto(m node.FailureMode) quotadv1.FailureMode {
	switch m {
	case node.FailOpen:
		return quotadv1.FailureMode_FAILURE_MODE_OPEN
	case node.FailClosed:
		return quotadv1.FailureMode_FAILURE_MODE_CLOSED
	}
	return quotadv1.FailureMode_FAILURE_MODE_UNSPECIFIED
}

// sourceToProto maps where a decision came from; an unknown source maps to
// SOURCE_UNSPECIFIED rather than failing a decision already made.
func sourceToProto(s node.Source) quotadv1.Source {
	switch s {
	case node.SourceStore:
		return quotadv1.Source_SOURCE_STORE
	case node.SourceLease:
		return quotadv1.Source_SOURCE_LEASE
	case node.SourceDeniedCache:
		return quotadv1.Source_SOURCE_DENIED_CACHE
	case node.SourceFailOpen:
		return quotadv1.Source_SOURCE_FAIL_OPEN
	case node.SourceFailClosed:
		return quotadv1.Source_SOURCE_FAIL_CLOSED
	}
	return quotadv1.Source_SOURCE_UNSPECIFIED
}

// checkResponse converts a decision. Both durations are always set (zero
// is "0s" in JSON), so clients never have to treat a missing one as zero.
func checkResponse(r node.Result) *quotadv1.CheckResponse {
	return &quotadv1.CheckResponse{
		Allowed:    r.Allowed,
		Limit:      r.Limit,
		Remaining:  r.Remaining,
		ResetAfter: durationpb.New(r.ResetAfter),
		RetryAfter: durationpb.New(r.RetryAfter),
		Source:     sourceToProto(r.Source),
	}
}

// policyToProto converts a configured policy, every field included.
func policyToProto(p node.Policy) *quotadv1.Policy {
	return &quotadv1.Policy{
		Name: p.Name,
		Limit: &quotadv1.Limit{
			Algorithm:    protoconv.AlgorithmToProto(p.Limit.Algorithm),
			Limit:        p.Limit.Limit,
			Period:       durationpb.New(p.Limit.Period),
			Burst:        p.Limit.Burst,
			OnStoreError: failureModeToProto(p.OnStoreError),
		},
	}
}
