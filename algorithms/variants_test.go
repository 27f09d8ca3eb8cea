package algorithms_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
)

// A check that names a variant records it in the family's SET whenever it
// writes state, and keeps the SET at least as long as the state; a denial,
// a cost of 0 and a check without a variant record nothing.
func TestCheckScriptsRecordVariants(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	const family = "{quotad:ns:k}"
	variantsKey := algorithms.VariantsKey(family)
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			if err := rdb.Del(ctx, variantsKey).Err(); err != nil {
				t.Fatal(err)
			}
			l := algorithms.Limit{Algorithm: a, Limit: 2, Period: time.Hour}
			script := redis.NewScript(algorithms.CheckScript(a))
			check := func(variant string, cost int64) algorithms.Decision {
				t.Helper()
				base := family + variant
				keys, args := algorithms.Keys(a, base), algorithms.CheckArgs(l, cost, 0)
				if variant != "" {
					keys, args = append(keys, variantsKey), append(args, variant)
				}
				d, err := algorithms.DecodeCheckReply(script.Run(ctx, rdb, keys, args...).Val())
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			members := func() []string {
				t.Helper()
				m, err := rdb.SMembers(ctx, variantsKey).Result()
				if err != nil {
					t.Fatal(err)
				}
				return m
			}

			check("", 1) // a configured policy's check
			check("/2/3600000/2", 0)
			if m := members(); len(m) != 0 {
				t.Fatalf("recorded %q without a write under a variant", m)
			}
			if d := check("/2/3600000/2", 2); !d.Allowed {
				t.Fatalf("first check denied: %+v", d)
			}
			if d := check("/2/3600000/2", 1); d.Allowed {
				t.Fatalf("over the limit allowed: %+v", d)
			}
			if m := members(); len(m) != 1 || m[0] != "/2/3600000/2" {
				t.Fatalf("variants %q, want just /2/3600000/2", m)
			}
			stateTTL := rdb.PTTL(ctx, algorithms.Keys(a, family+"/2/3600000/2")[0]).Val()
			setTTL := rdb.PTTL(ctx, variantsKey).Val()
			// Read one after the other: allow a few ms between them.
			if stateTTL <= 0 || setTTL < stateTTL-10*time.Millisecond {
				t.Fatalf("state TTL %s, the SET's %s: the SET must outlive the state", stateTTL, setTTL)
			}
			// A later write with a shorter TTL does not shorten the SET's.
			short := "/2/1000/2"
			l.Period = time.Second
			check(short, 1)
			if got := rdb.PTTL(ctx, variantsKey).Val(); got < setTTL-time.Second {
				t.Fatalf("the SET's TTL fell from %s to %s", setTTL, got)
			}
			if m := members(); len(m) != 2 {
				t.Fatalf("variants %q, want two", m)
			}
		})
	}
}
