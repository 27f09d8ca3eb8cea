package rpc

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/internal/rlqssim"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc/rlqs"
)

// rlqsMember is one quotad node serving Envoy's rate limit quota service
// on a loopback port, over a real redis-server.
type rlqsMember struct {
	node *node.Node
	svc  *rlqs.Service
	conn *grpc.ClientConn
}

// startRLQSMember starts a node on r serving cfg's rules, its rounds
// running until the test ends.
func startRLQSMember(t *testing.T, r *redistest.Server, cfg rlqs.Config, policies ...node.Policy) *rlqsMember {
	t.Helper()
	n, err := node.New(node.Config{Policies: policies}, redisStoreOn(t, r), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	svc, err := rlqs.New(n, cfg, policies, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	h, err := NewHandler(n, Config{RLQS: svc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	url := serveAPI(t, h, h)
	conn, err := grpc.NewClient(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rlqsMember{node: n, svc: svc, conn: conn}
}

// rlqsPolicy is a token bucket policy of rate units a second.
func rlqsPolicy(t *testing.T, name string, rate int64) node.Policy {
	t.Helper()
	p, err := node.NewPolicy(node.Policy{Name: name, Limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: rate, Period: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// eventually polls cond every 50 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRLQSOneEnvoyGetsATokenBucketWithinThePolicysRate(t *testing.T) {
	r := redistest.Start(t)
	p := rlqsPolicy(t, "per-client", 20)
	cfg := rlqs.Config{AssignmentInterval: time.Second, Domains: []rlqs.Domain{{
		Name:    "edge",
		Buckets: []rlqs.Rule{{Bucket: map[string]string{"name": "*"}, Target: rlqs.Target{Policy: p.Name}}},
	}}}
	m := startRLQSMember(t, r, cfg, p)
	e := rlqssim.New(m.conn, rlqssim.Config{Domain: "edge", ReportingInterval: time.Second})
	defer e.Close()
	id := map[string]string{"name": "a"}
	ctx, cancel := context.WithCancel(context.Background())
	load := rlqssim.Drive(ctx, e, id, 50)
	defer func() { cancel(); load.Wait() }()
	eventually(t, 15*time.Second, "a token bucket of 15 to 20 a second", func() bool {
		f := e.Bucket(id)
		return f.Rate >= 15 && f.Rate <= 20
	})
	if f := e.Bucket(id); f.Rate > 20 || math.IsNaN(f.Rate) {
		t.Fatalf("assigned %v a second, over the policy's 20", f.Rate)
	}
}
