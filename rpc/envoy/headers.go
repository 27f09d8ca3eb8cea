package envoy

import (
	"fmt"
	"math"
	"strconv"

	"golang.org/x/net/http/httpguts"

	corev3 "github.com/quotad/quotad/proto/envoy/config/core/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// This file is envoyproxy/ratelimit's rate limit response headers
// (LIMIT_RESPONSE_HEADERS_ENABLED): the limit, what is left and the
// seconds until it resets, of the descriptor closest to its limit, for
// Envoy to add to the response it sends downstream.

func (h ResponseHeaders) validate() error {
	for _, n := range []string{h.Limit, h.Remaining, h.Reset} {
		if !httpguts.ValidHeaderFieldName(n) {
			return fmt.Errorf("envoy response headers: %w: %q is not a header name", ErrInvalidConfig, n)
		}
	}
	if h.Limit == h.Remaining || h.Limit == h.Reset || h.Remaining == h.Reset {
		return fmt.Errorf("envoy response headers: %w: the three names must differ (%s, %s, %s)", ErrInvalidConfig, h.Limit, h.Remaining, h.Reset)
	}
	return nil
}

// of returns the headers for a response's statuses, as envoyproxy/ratelimit
// chooses them: the status with a limit and the least remaining, or the
// last one over a limit that is not in quota mode (quota[i]); none when no
// status had a limit.
func (h ResponseHeaders) of(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, quota []bool) []*corev3.HeaderValue {
	var closest *rlsv3.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for i, st := range statuses {
		if st.GetCurrentLimit() != nil && st.GetLimitRemaining() < least {
			closest, least = st, st.GetLimitRemaining()
		}
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT && !quota[i] {
			closest, least = st, 0
		}
	}
	if closest == nil {
		return nil
	}
	// Whole seconds, rounded up: a client that waits that long finds the
	// limit reset.
	reset := closest.GetDurationUntilReset().AsDuration()
	seconds := int64(math.Ceil(reset.Seconds()))
	return []*corev3.HeaderValue{
		{Key: h.Limit, Value: strconv.FormatUint(uint64(closest.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		{Key: h.Remaining, Value: strconv.FormatUint(uint64(closest.GetLimitRemaining()), 10)},
		{Key: h.Reset, Value: strconv.FormatInt(seconds, 10)},
	}
}
