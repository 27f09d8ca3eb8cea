package quotadclient

import (
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
)

func TestHeaderItems(t *testing.T) {
	cases := []struct {
		name, got, want string
	}{
		{"policy with window", policyItem("api", 100, time.Minute), `"api";q=100;w=60`},
		{"policy without window", policyItem("api", 100, 0), `"api";q=100`},
		{"policy with a fractional window", policyItem("api", 100, 1500*time.Millisecond), `"api";q=100`},
		{"escapes", policyItem(`a"b\c`+"\n\u00e9", 1, 0), `"a\"b\\c???";q=1`},
		{"allowed", limitItem("api", decision(true, 37, 11200*time.Millisecond, 0), false), `"api";r=37;t=12`},
		{"full", limitItem("api", decision(true, 100, 0, 0), false), `"api";r=100;t=0`},
		// A bucket: restored fully in 50s, but the denied cost fits again
		// in 2s. t is capped at Retry-After.
		{"denied", limitItem("api", decision(false, 1, 50*time.Second, 1500*time.Millisecond), true), `"api";r=1;t=2`},
		// A denied cost-0 check sends no Retry-After, so t is not capped.
		{"denied peek", limitItem("api", decision(false, 0, 50*time.Second, 1500*time.Millisecond), false), `"api";r=0;t=50`},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
}

func decision(allowed bool, remaining int64, reset, retry time.Duration) Decision {
	return Decision{Decision: algorithms.Decision{Allowed: allowed, Limit: 100, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}}
}

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		0: 1, time.Millisecond: 1, time.Second: 1, time.Second + time.Millisecond: 2, 59*time.Second + 999*time.Millisecond: 60,
	} {
		if got := retryAfterSeconds(d); got != want {
			t.Errorf("retryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}
