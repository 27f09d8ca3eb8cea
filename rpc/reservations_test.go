package rpc

import (
	"net/http"
	"strings"
	"testing"

	"github.com/quotad/quotad/node/store/memory"
)

// Reserve and Settle answer bad input with InvalidArgument, naming the
// field and what is accepted, as docs/errors.md quotes them.
func TestBadReservationRequests(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	c := http1Client(t)
	const fw = `"limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}`
	for name, tc := range map[string]struct{ procedure, body, want string }{
		"a lifetime over a day": {"Reserve", `{"policy":"demo","key":"k","lifetime":"25h",` + fw + `}`,
			`lifetime: invalid reservation: 25h0m0s (want whole milliseconds from 1ms to 24h0m0s, e.g. \"600s\")`},
		"a concurrency limit": {"Reserve", `{"policy":"demo","key":"k","limit":{"algorithm":"ALGORITHM_CONCURRENCY","limit":"5","period":"60s"}}`,
			`policy demo: a concurrency limit cannot be reserved; take a slot with Check`},
		"a negative estimate": {"Reserve", `{"policy":"demo","key":"k","cost":"-3",` + fw + `}`,
			`cost: invalid cost: -3 must be \u003e= 0`},
		"no reservation id": {"Settle", `{"policy":"demo","key":"k","reservationId":"","actual":"1",` + fw + `}`,
			`reservation_id: invalid reservation: 0 bytes (want 1 to 64)`},
		"a negative actual": {"Settle", `{"policy":"demo","key":"k","reservationId":"x","actual":"-1",` + fw + `}`,
			`actual: invalid cost: -1 (want 0 to 4503599627370496, the most a key of this limit can owe)`},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := postJSON(t, c, ts.URL, "/quotad.v1.QuotaService/"+tc.procedure, "application/json", tc.body)
			if status != http.StatusBadRequest || !strings.Contains(body, `"invalid_argument"`) || !strings.Contains(body, tc.want) {
				t.Fatalf("got %d %s, want 400 invalid_argument with %s", status, body, tc.want)
			}
		})
	}
}
