package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// Six built quotad processes on 127.0.0.1 to .6, one redis-server, one
// gossip key: more than the three peers a node sends its own denials to,
// so the others learn of a denial through relays. Each learns it exactly
// once (a node that sends to every member sends twice), and answers the
// key from its denied cache without a Redis call, in whole milliseconds.
func TestSixProcessClusterSpreadsDenialsThroughRelays(t *testing.T) {
	const n = 6
	r := redistest.Start(t)
	bin := quotadtest.Binary(t)
	key := make([]byte, 32)
	rand.Read(key)
	keyFile := writeFile(t, "gossip.key", base64.StdEncoding.EncodeToString(key)+"\n")

	procs := []*proc{startProc(t, bin, 1, r.URL(), "", keyFile)}
	seed := "127.0.0.1:" + procs[0].gossipPort(t)
	for i := 2; i <= n; i++ {
		procs = append(procs, startProc(t, bin, i, r.URL(), seed, keyFile))
	}
	for _, p := range procs {
		waitCluster(t, p, 20*time.Second, fmt.Sprintf("a cluster of %d", n), func(v clusterView) bool { return v.Size == n })
	}
	rc := redis.NewClient(&redis.Options{Addr: r.Addr(), PoolSize: 1})
	defer rc.Close()
	ctx := context.Background()

	lim := &quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_SLIDING_WINDOW_LOG, Limit: 5, Period: durationpb.New(time.Hour)}
	for i := range 5 {
		if res, err := checkOn(ctx, procs[0], "spread", "abuser", lim); err != nil || !res.Allowed {
			t.Fatalf("check %d on node-1: %v, %v", i+1, res, err)
		}
	}
	before := make([]clusterView, n)
	for i, p := range procs {
		v, err := p.cluster(t)
		if err != nil {
			t.Fatal(err)
		}
		before[i] = v
	}
	res, err := checkOn(ctx, procs[0], "spread", "abuser", lim)
	if err != nil || res.Allowed || res.Source != quotadv1.Source_SOURCE_STORE {
		t.Fatalf("sixth check on node-1: %v, %v; want denied by Redis", res, err)
	}
	for i, p := range procs[1:] {
		waitCluster(t, p, 10*time.Second, "told of the denial", func(v clusterView) bool {
			return v.Gossip.DenialsReceived > before[i+1].Gossip.DenialsReceived
		})
	}
	calls := scriptCalls(t, rc)
	for i, p := range procs[1:] {
		got, err := checkOn(ctx, p, "spread", "abuser", lim)
		if err != nil || got.Allowed || got.Source != quotadv1.Source_SOURCE_DENIED_CACHE || got.RetryAfter.AsDuration() < 55*time.Minute || got.RetryAfter.AsDuration() > res.RetryAfter.AsDuration() {
			t.Fatalf("%s answered %v, %v; want the denial from its denied cache, no longer than Redis's %s", p.name, got, err, res.RetryAfter.AsDuration())
		}
		if r, rs := got.RetryAfter.AsDuration(), got.ResetAfter.AsDuration(); r%time.Millisecond != 0 || rs%time.Millisecond != 0 {
			t.Fatalf("%s answered waits of %s and %s; want whole milliseconds", p.name, r, rs)
		}
		// Relays' further copies are refused by number: taken once.
		v, err := p.cluster(t)
		if err != nil {
			t.Fatal(err)
		}
		if d := v.Gossip.DenialsReceived - before[i+1].Gossip.DenialsReceived; d != 1 {
			t.Fatalf("%s took the denial %d times; want once", p.name, d)
		}
	}
	if after := scriptCalls(t, rc); after != calls {
		t.Fatalf("the other nodes' answers cost Redis %d script calls", after-calls)
	}
}
