package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/delayproxy"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// Attacks on all-or-nothing batches, each against a quotad binary: what a
// denied batch leaves behind must be as if it had never been sent, at
// Redis and on the node's pages.

// nodeStatus is the part of GET /status the overload tests read.
type nodeStatus struct {
	Store struct {
		Breaker      string `json:"breaker"`
		BreakerOpens int64  `json:"breaker_opens"`
		Errors       int64  `json:"errors"`
	} `json:"store"`
	Policies []struct {
		Name      string `json:"name"`
		TopDenied *struct {
			Keys []struct {
				Key   string `json:"key"`
				Count uint64 `json:"count"`
			} `json:"keys"`
		} `json:"top_denied"`
	} `json:"policies"`
}

// readStatus GETs /status.
func readStatus(base string) (nodeStatus, error) {
	var st nodeStatus
	resp, err := http.Get(base + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET /status: status %d", resp.StatusCode)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Redis's replies 200ms late, well past a 50ms --redis-timeout (so that
// the node judges Redis late, not itself, even under a busy machine's
// scheduling lag): an
// all-or-nothing batch whose first take times out is denied by that
// item's failure mode (closed). The take ran at Redis all the same; once
// its late reply comes, the node gives it back, so the key's remaining at
// Redis is untouched, and so is the other item's.
func TestDeniedBatchGivesBackALateTake(t *testing.T) {
	r := redistest.Start(t)
	px := delayproxy.Start(t, r.Addr())
	cfg := writeFile(t, "q.yaml", `policies:
  - name: aon
    algorithm: fixed_window
    limit: 10
    period: 1h
    on_store_error: closed
    lease: off
`)
	p := startProcess(t, "--config", cfg, "--redis", "redis://"+px.Addr()+"/0", "--redis-timeout", "50ms")
	quotadtest.AwayFromWindowEnd(t, time.Hour, 10*time.Second)
	client := quotadv1connect.NewQuotaServiceClient(http.DefaultClient, p.URL)
	ctx := context.Background()
	// Connections open and round trips measured on the quick Redis.
	for range 5 {
		if _, err := client.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "aon", Key: "warm"})); err != nil {
			t.Fatal(err)
		}
	}

	px.SetDelay(0, 200*time.Millisecond)
	res, err := client.CheckBatch(ctx, connect.NewRequest(&quotadv1.CheckBatchRequest{AllOrNothing: true, Requests: []*quotadv1.CheckRequest{
		{Policy: "aon", Key: "a"}, {Policy: "aon", Key: "b"},
	}}))
	if err != nil {
		t.Fatal(err)
	}
	first := res.Msg.GetResults()[0].GetResponse()
	if first.GetAllowed() || first.GetSource() != quotadv1.Source_SOURCE_FAIL_CLOSED {
		t.Fatalf("first item of the batch on the late Redis: %v, want denied by its failure mode", first)
	}
	px.SetDelay(0, 0)

	store, err := redis.New(ctx, redis.Config{URL: r.URL(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	lim := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 10, Period: time.Hour}
	remaining := func(key string) int64 {
		d, _, err := store.Acquire(ctx, node.AcquireRequest{Base: "{quotad:aon:" + key + "}", Limit: lim})
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	// The late reply comes 200ms after the take, and its give-back is one
	// more call: well within the wait.
	deadline := time.Now().Add(5 * time.Second)
	for remaining("a") != lim.Limit && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	a, b := remaining("a"), remaining("b")
	t.Logf("after the denied batch: a has %d of %d remaining at Redis, b %d", a, lim.Limit, b)
	if a != lim.Limit || b != lim.Limit {
		t.Errorf("the denied batch spent at Redis: a has %d remaining, b %d, want %d each", a, b, lim.Limit)
	}
}

// Sixty all-or-nothing batches, each denied by one exhausted key: their
// other items, whose own limits never denied them (one taken and given
// back before the exhausted key was reached, one never reached), are not
// among their policies' top denied keys on /status; the exhausted key is.
func TestDeniedBatchesListOnlyKeysTheirOwnLimitDenied(t *testing.T) {
	cfg := writeFile(t, "q.yaml", `policies:
  - name: a-victim
    algorithm: fixed_window
    limit: 100
    period: 1h
  - name: m-tiny
    algorithm: fixed_window
    limit: 1
    period: 1h
  - name: z-victim
    algorithm: fixed_window
    limit: 100
    period: 1h
`)
	p := startProcess(t, "--config", cfg, "--console-show-keys")
	quotadtest.AwayFromWindowEnd(t, time.Hour, 10*time.Second)
	client := quotadv1connect.NewQuotaServiceClient(http.DefaultClient, p.URL)
	ctx := context.Background()
	if res, err := client.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "m-tiny", Key: "x"})); err != nil || !res.Msg.GetAllowed() {
		t.Fatalf("the exhausting check: %v, %v", res, err)
	}
	for range 60 {
		res, err := client.CheckBatch(ctx, connect.NewRequest(&quotadv1.CheckBatchRequest{AllOrNothing: true, Requests: []*quotadv1.CheckRequest{
			{Policy: "a-victim", Key: "v"}, {Policy: "m-tiny", Key: "x"}, {Policy: "z-victim", Key: "v"},
		}}))
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res.Msg.GetResults() {
			resp := r.GetResponse()
			if resp.GetAllowed() || (i == 1) != (resp.GetRetryAfter().AsDuration() > 0) {
				t.Fatalf("item %d of a batch denied by item 1: %v", i, resp)
			}
		}
	}
	st, err := readStatus(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	top := map[string][]string{}
	for _, pol := range st.Policies {
		if pol.TopDenied == nil {
			continue
		}
		for _, k := range pol.TopDenied.Keys {
			top[pol.Name] = append(top[pol.Name], fmt.Sprintf("%s (%d)", k.Key, k.Count))
		}
	}
	t.Logf("top denied keys: %v", top)
	if len(top["a-victim"]) != 0 || len(top["z-victim"]) != 0 {
		t.Errorf("keys whose own limit never denied them are listed as top denied: a-victim %v, z-victim %v", top["a-victim"], top["z-victim"])
	}
	if len(top["m-tiny"]) != 1 || !strings.HasPrefix(top["m-tiny"][0], "x ") {
		t.Errorf("m-tiny's top denied keys %v, want x", top["m-tiny"])
	}
}
