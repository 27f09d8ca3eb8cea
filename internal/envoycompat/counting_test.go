package envoycompat

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotad/quotad/internal/memcachedtest"
	"github.com/quotad/quotad/internal/redistest"
)

// As envoyproxy/ratelimit counts hits (its fixed window is an INCRBY):
// limit 10, hits_addend 27 then 3 answers OVER_LIMIT twice with nothing
// remaining, on the embedded store and on Redis; with
// --envoy-stop-increment-when-over-limit (its
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, mapped to quotad's own counting)
// the 27 are over the limit and not counted, and the 3 are admitted with 7
// remaining. On memcached too.
func TestHitsOverTheLimitCount(t *testing.T) {
	r := redistest.Start(t)
	mc := memcachedtest.Start(t)
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
		// memcached as upstream's memcache backend: the 27 are added and
		// stay counted; with stop increment they are given back (DECR).
		{"memcache", []string{"--memcache", mc.Addr()}, over, over, [2]int64{0, 0}},
		{"memcache, stop increment", []string{"--memcache", mc.Addr(), "--envoy-stop-increment-when-over-limit", "--key-prefix", "stop"}, over, ok, [2]int64{10, 7}},
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

// aiGateway is quotad's own schema: tokens per model in a token bucket of
// 10 refilled 10 an hour, each hit counted whether or not it fits unless
// stop_increment_when_over_limit.
const aiGateway = `policies:
  - name: tokens
    algorithm: token_bucket
    limit: 10
    period: 1h
envoy:
  stop_increment_when_over_limit: %v
  domains:
    - domain: ai_gateway
      descriptors:
        - key: model
          policy: tokens
`

// An AI gateway's flow against a quotad binary, on the embedded store and
// on Redis, with a policy of quotad's own schema (a token bucket): a
// check-only request (the descriptor's hits_addend 0), then the response's
// 12 tokens once it is done (apply_on_stream_done). Counted, they leave the
// bucket owing 2 tokens beyond empty, so the next check-only request is
// OVER_LIMIT, as is a request of 3, counted too; with stop_increment_when_over_limit the
// 12 spend nothing and the next request is OK with 10 remaining.
func TestAIGatewayTokensCount(t *testing.T) {
	r := redistest.Start(t)
	perHour := limit{10, rlsv3.RateLimitResponse_RateLimit_HOUR, "tokens"}
	for _, store := range []string{"memory", "redis"} {
		for _, stop := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, stop increment %v", store, stop), func(t *testing.T) {
				cfg := fmt.Sprintf(aiGateway, stop)
				if store == "redis" {
					cfg += fmt.Sprintf("redis:\n  url: %s\nkey_prefix: ai%v\n", r.URL(), stop)
				}
				c := dial(t, startQuotad(t, cfg))
				checkOnly := desc("model", "m")
				checkOnly.HitsAddend = wrapperspb.UInt64(0)
				c.want("check before the first response", c.call("ai_gateway", 1, checkOnly).GetStatuses()[0], ok, perHour, 10)
				tokens := c.call("ai_gateway", 12, desc("model", "m"))
				if stop {
					c.want("a response of 12 tokens, not counted", tokens.GetStatuses()[0], over, perHour, 10)
					c.want("check after it", c.call("ai_gateway", 1, checkOnly).GetStatuses()[0], ok, perHour, 10)
					return
				}
				c.want("a response of 12 tokens, counted", tokens.GetStatuses()[0], over, perHour, 0)
				c.want("check after it", c.call("ai_gateway", 1, checkOnly).GetStatuses()[0], over, perHour, 0)
				three := c.call("ai_gateway", 3, desc("model", "m"))
				c.want("3 tokens after it", three.GetStatuses()[0], over, perHour, 0)
				// 15 tokens charged from a full bucket of 10: 5 owed beyond
				// empty, so 15 to refill, one every 6 minutes: whole again
				// after 90 minutes.
				if d := three.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d < 89*time.Minute || d > 90*time.Minute {
					t.Errorf("3 tokens after 12: duration_until_reset %s, want about 1h30m (15 tokens to refill, one per 6m)", d)
				}
			})
		}
	}
}
