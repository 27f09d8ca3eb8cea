package main

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/internal/testpki"
)

// The cluster view on members that serve their API over mutual TLS and
// require an admin token for admin calls: the member asked reaches the
// others over TLS with its own certificate (the members must trust it as
// a client, and it them as servers), and the view needs no token, since
// GET /status needs none. Both members answer; the URLs asked are https.
func TestClusterViewOverMutualTLSWithAnAdminToken(t *testing.T) {
	r := redistest.Start(t)
	ca := testpki.NewCA(t, "quotad cluster CA")
	member := ca.IssueMember(t, "quotad member", net.IPv4(127, 0, 0, 1), net.IPv4(127, 0, 0, 2))
	client := ca.Issue(t, "operator", false)
	// GET /cluster needs TLS too: the test waits for the view itself.
	procs := startSharedPort(t, 2, r.URL(),
		"--tls-cert-file", writeFile(t, "member.crt", string(member.CertPEM)),
		"--tls-key-file", writeFile(t, "member.key", string(member.KeyPEM)),
		"--tls-client-ca-file", writeFile(t, "ca.crt", string(ca.PEM)),
		"--admin-token-file", writeFile(t, "admin.token", "s3cret-token\n"))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsClient(ca, &client)}}

	// Generous: gossip forms the cluster of two within a second or so.
	deadline := time.Now().Add(30 * time.Second)
	var view clusterViewMembers
	for {
		var err error
		view, err = clusterViewOf(hc, procs[1].api)
		if err == nil && view.Answered == 2 && len(view.Members) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-2's cluster view over TLS: %+v, %v; want both members answering", view, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, m := range view.Members {
		if !m.Answered || (m.Name == "node-1" && !strings.HasPrefix(m.API, "https://127.0.0.1:")) {
			t.Errorf("member %+v, want it answered, node-1 asked over https", m)
		}
	}
}

// clusterViewOf reads GET /status?scope=cluster of the node at base,
// with hc.
func clusterViewOf(hc *http.Client, base string) (clusterViewMembers, error) {
	var v clusterViewMembers
	res, err := hc.Get(base + "/status?scope=cluster")
	if err != nil {
		return v, err
	}
	defer res.Body.Close()
	return v, json.NewDecoder(res.Body).Decode(&v)
}

// clusterViewMembers is the part of GET /status?scope=cluster these tests
// read.
type clusterViewMembers struct {
	Answered int `json:"answered"`
	Members  []struct {
		Name, API, Error string
		Answered         bool
	} `json:"members"`
}

// member returns the member called name; the test fails without one.
func (v clusterViewMembers) member(t *testing.T, name string) (api, errText string, answered bool) {
	t.Helper()
	for _, m := range v.Members {
		if m.Name == name {
			return m.API, m.Error, m.Answered
		}
	}
	t.Fatalf("no member %s in %+v", name, v)
	return "", "", false
}

// Members whose API listens on different ports: node-2, told node-1's
// port with --cluster-api-port, asks node-1 there and gets its figures;
// node-1, left to its default (its own --listen port), asks node-2 on a
// port where node-2 does not listen, and shows node-2 as not answering
// with an error that names --cluster-api-port, the setting to fix.
func TestClusterAPIPortSaysWhereMembersAreAsked(t *testing.T) {
	r := redistest.Start(t)
	bin := quotadtest.Binary(t)
	a := startProc(t, bin, 1, r.URL(), "", "")
	_, port1, err := net.SplitHostPort(strings.TrimPrefix(a.api, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	b := startProc(t, bin, 2, r.URL(), "127.0.0.1:"+a.gossipPort(t), "", "--cluster-api-port", port1)
	for _, p := range []*proc{a, b} {
		waitCluster(t, p, 20*time.Second, "a cluster of two", func(v clusterView) bool { return v.Size == 2 })
	}
	hc := &http.Client{Timeout: 10 * time.Second}

	fromB, err := clusterViewOf(hc, b.api)
	if err != nil {
		t.Fatal(err)
	}
	if api, errText, answered := fromB.member(t, "node-1"); !answered || api != "http://127.0.0.1:"+port1 {
		t.Errorf("node-2's view of node-1: asked at %q, answered %t (%s); want it answered at http://127.0.0.1:%s", api, answered, errText, port1)
	}

	fromA, err := clusterViewOf(hc, a.api)
	if err != nil {
		t.Fatal(err)
	}
	api, errText, answered := fromA.member(t, "node-2")
	if answered || api != "http://127.0.0.2:"+port1 || !strings.Contains(errText, "--cluster-api-port") {
		t.Errorf("node-1's view of node-2: asked at %q, answered %t, error %q; want it asked at http://127.0.0.2:%s, unanswered, the error naming --cluster-api-port", api, answered, errText, port1)
	}
	if fromA.Answered != 1 {
		t.Errorf("node-1's view counts %d members answering, want 1 (itself)", fromA.Answered)
	}
}
