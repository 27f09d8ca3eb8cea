package node_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// Members that publish their demand in round 5 all read the same set in
// round 6, whoever asks first, and a member that did not publish in 5
// reads it too; a round nobody published in reads empty. The same on both
// stores.
func TestShareDemandReadsEveryMembersVectorOfTheRoundBefore(t *testing.T) {
	r := redistest.Start(t)
	stores := map[string]func() node.Store{
		"memory": func() node.Store { return memory.New(nil, 0) },
		"redis":  func() node.Store { return newRedisStore(t, r) },
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			n := newNode(t, open(), node.Config{})
			ctx := context.Background()
			p := node.Policy{Name: "shared-" + name, Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100, Period: time.Second}}
			share := func(member string, round int64, vector string) map[string]string {
				t.Helper()
				got, err := n.ShareDemand(ctx, p, "edge|name=a", member, round, vector, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			if got := share("a", 5, "1,2"); len(got) != 0 {
				t.Fatalf("round 5 read %v, want nothing of round 4", got)
			}
			share("b", 5, "+Inf")
			want := map[string]string{"a": "1,2", "b": "+Inf"}
			if got := share("b", 6, "3"); !maps.Equal(got, want) {
				t.Fatalf("b in round 6 read %v, want %v", got, want)
			}
			if got := share("a", 6, "4"); !maps.Equal(got, want) {
				t.Fatalf("a in round 6, after b wrote its round 6, read %v, want %v", got, want)
			}
			if got := share("c", 6, ""); !maps.Equal(got, want) {
				t.Fatalf("c, new in round 6, read %v, want %v", got, want)
			}
			if got := share("a", 8, "5"); len(got) != 0 {
				t.Fatalf("round 8 read %v, want nothing: nobody published in 7", got)
			}
			if _, err := n.ShareDemand(ctx, p, "edge|name=a", "", 9, "1", time.Minute); err == nil {
				t.Fatal("an empty member was accepted")
			}
		})
	}
}
