package rpc

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/cluster"
	"github.com/quotad/quotad/node/store/memory"
)

func getCluster(t *testing.T, base string) clusterJSON {
	t.Helper()
	resp, err := http.Get(base + "/cluster")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /cluster: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var out clusterJSON
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestClusterPageStandalone(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	got := getCluster(t, ts.URL)
	if got.Clustered || got.Node != "" || got.Size != 1 || got.LeaseShare != 0.05 || len(got.Members) != 0 {
		t.Fatalf("standalone /cluster: %+v", got)
	}
}

// A node in a (one-member) cluster on real UDP and TCP sockets lists
// itself, and its lease and cache figures move with checks.
func TestClusterPageMember(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	m, err := cluster.New(cluster.Config{NodeName: "solo", BindAddr: addr, DeadAfter: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Cluster: m}, redisStore(t), nil)
	if err != nil {
		m.Shutdown()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h, err := NewHandler(n, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := serveH2C(t, h)
	// A sliding log's denial holds for most of the hour, long enough to
	// be worth gossiping.
	p := node.Policy{Name: "demo", Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 5, Period: time.Hour}}
	for range 6 {
		if _, err := n.Check(context.Background(), p, "k", 1); err != nil {
			t.Fatal(err)
		}
	}
	got := getCluster(t, base)
	if !got.Clustered || got.Node != "solo" || got.Size != 1 || len(got.Members) != 1 {
		t.Fatalf("/cluster: %+v", got)
	}
	if mb := got.Members[0]; mb.Name != "solo" || mb.Addr != addr || mb.State != "alive" || !mb.Self || mb.Since.IsZero() {
		t.Fatalf("member %+v", mb)
	}
	// The sixth check was denied and remembered (and queued for peers,
	// though there are none).
	if got.DeniedCache.DenialsCached != 1 || got.Gossip.DenialsSent != 1 {
		t.Fatalf("denied cache %+v, gossip %+v after a denial", got.DeniedCache, got.Gossip)
	}
}
