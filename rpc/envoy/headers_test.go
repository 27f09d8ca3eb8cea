package envoy

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

func status(code rlsv3.RateLimitResponse_Code, perUnit, remaining uint32, reset time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining, DurationUntilReset: durationpb.New(reset),
		CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: perUnit, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}}
}

// The headers describe the descriptor envoyproxy/ratelimit describes: the
// one with the least remaining, or the last over its limit; none without a
// limited descriptor.
func TestResponseHeadersOf(t *testing.T) {
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	unlimited := &rlsv3.RateLimitResponse_DescriptorStatus{Code: ok, LimitRemaining: 4294967295}
	for _, c := range []struct {
		name     string
		statuses []*rlsv3.RateLimitResponse_DescriptorStatus
		want     string
	}{
		{"least remaining", []*rlsv3.RateLimitResponse_DescriptorStatus{status(ok, 100, 40, 30*time.Second), status(ok, 10, 3, 1500*time.Millisecond), unlimited}, "[10 3 2]"},
		{"last over the limit", []*rlsv3.RateLimitResponse_DescriptorStatus{status(over, 5, 0, 9*time.Second), status(ok, 10, 0, time.Second), status(over, 7, 0, 59*time.Second)}, "[7 0 59]"},
		{"no limit", []*rlsv3.RateLimitResponse_DescriptorStatus{unlimited, {Code: ok}}, "[]"},
	} {
		hs := DefaultResponseHeaders.of(c.statuses, make([]bool, len(c.statuses)))
		var got []string
		for i, h := range hs {
			if want := []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}[i]; h.GetKey() != want {
				t.Errorf("%s: header %d is %s, want %s", c.name, i, h.GetKey(), want)
			}
			got = append(got, h.GetValue())
		}
		if fmt.Sprint(got) != c.want && !(c.want == "[]" && len(got) == 0) {
			t.Errorf("%s: %v, want %s", c.name, got, c.want)
		}
	}
}

func TestResponseHeaderNamesAreChecked(t *testing.T) {
	for _, h := range []ResponseHeaders{{"A", "B", ""}, {"A", "A", "B"}, {"A b", "B", "C"}} {
		if err := h.validate(); err == nil {
			t.Errorf("%+v accepted", h)
		}
	}
	if err := (ResponseHeaders{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}).validate(); err != nil {
		t.Error(err)
	}
}
