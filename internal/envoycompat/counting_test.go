package envoycompat

import (
	"os"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotad/quotad/internal/redistest"
)

// As envoyproxy/ratelimit counts hits (its fixed window is an INCRBY):
// limit 10, hits_addend 27 then 3 answers OVER_LIMIT twice with nothing
// remaining, on the embedded store and on Redis; with
// --envoy-stop-increment-when-over-limit (its
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, mapped to quotad's own counting)
// the 27 are over the limit and not counted, and the 3 are admitted with 7
// remaining.
func TestHitsOverTheLimitCount(t *testing.T) {
	r := redistest.Start(t)
	for _, c := range []struct {
		name              string
		args              []string
		afterFirst, three rlsv3.RateLimitResponse_Code
		left              [2]int64
	}{
		{"memory store", nil, over, over, [2]int64{0, 0}},
		{"redis", []string{"--redis", r.URL()}, over, over, [2]int64{0, 0}},
		// The 27 are over the limit and not counted: 10 remain, the 3 fit.
		{"memory store, stop increment", []string{"--envoy-stop-increment-when-over-limit"}, over, ok, [2]int64{10, 7}},
		{"redis, stop increment", []string{"--redis", r.URL(), "--envoy-stop-increment-when-over-limit", "--key-prefix", "stop"}, over, ok, [2]int64{10, 7}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			rules := "domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"
			if err := os.WriteFile(filepath.Join(dir, "ai.yaml"), []byte(rules), 0o600); err != nil {
				t.Fatal(err)
			}
			addr, _ := runQuotad(t, append([]string{"--envoy-config-dir", dir}, c.args...)...)
			cl := dial(t, addr)
			perHour := limit{10, rlsv3.RateLimitResponse_RateLimit_HOUR, ""}
			cl.want("27 hits", cl.call("ai", 27, desc("tenant", "acme")).GetStatuses()[0], c.afterFirst, perHour, c.left[0])
			cl.want("3 hits after them", cl.call("ai", 3, desc("tenant", "acme")).GetStatuses()[0], c.three, perHour, c.left[1])
		})
	}
}
