// Package protoconv maps the API's protobuf enums to the domain's types,
// once, for every side that speaks the API: the server (rpc), the Go
// client (rpc/quotadclient) and quotabench. Each mapping is one explicit
// table rather than a cast or a lookup by name, so that the two numberings
// may drift apart without silently selecting the wrong value.
package protoconv

import (
	"github.com/quotad/quotad/algorithms"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// algorithmPairs is the one mapping between algorithms.Algorithm and the
// API's Algorithm enum.
var algorithmPairs = [...]struct {
	domain algorithms.Algorithm
	proto  quotadv1.Algorithm
}{
	{algorithms.FixedWindow, quotadv1.Algorithm_ALGORITHM_FIXED_WINDOW},
	{algorithms.SlidingWindowLog, quotadv1.Algorithm_ALGORITHM_SLIDING_WINDOW_LOG},
	{algorithms.SlidingWindowCounter, quotadv1.Algorithm_ALGORITHM_SLIDING_WINDOW_COUNTER},
	{algorithms.TokenBucket, quotadv1.Algorithm_ALGORITHM_TOKEN_BUCKET},
	{algorithms.LeakyBucket, quotadv1.Algorithm_ALGORITHM_LEAKY_BUCKET},
	{algorithms.GCRA, quotadv1.Algorithm_ALGORITHM_GCRA},
	{algorithms.Concurrency, quotadv1.Algorithm_ALGORITHM_CONCURRENCY},
}

// AlgorithmFromProto returns the algorithm a names; false for
// ALGORITHM_UNSPECIFIED and for a number the table does not have.
func AlgorithmFromProto(a quotadv1.Algorithm) (algorithms.Algorithm, bool) {
	for _, p := range algorithmPairs {
		if p.proto == a {
			return p.domain, true
		}
	}
	return 0, false
}

// AlgorithmToProto is the inverse of AlgorithmFromProto; an algorithm the
// table does not have maps to ALGORITHM_UNSPECIFIED, which quotad rejects.
func AlgorithmToProto(a algorithms.Algorithm) quotadv1.Algorithm {
	for _, p := range algorithmPairs {
		if p.domain == a {
			return p.proto
		}
	}
	return quotadv1.Algorithm_ALGORITHM_UNSPECIFIED
}
