package main

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

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

	var view struct {
		Answered int `json:"answered"`
		Members  []struct {
			Name, API, Error string
			Answered         bool
		} `json:"members"`
	}
	// Generous: gossip forms the cluster of two within a second or so.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := hc.Get(procs[1].api + "/status?scope=cluster")
		if err == nil {
			err = json.NewDecoder(res.Body).Decode(&view)
			res.Body.Close()
		}
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
