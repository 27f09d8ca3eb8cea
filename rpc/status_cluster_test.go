package rpc

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
)

// A GET /status with a parameter it does not know, or a value it does not
// take, is refused with 400 and the parameters and values it takes.
func TestStatusQueryErrorsSayWhatIsAccepted(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	for query, want := range map[string]string{
		"scope=everything":      `want scope=node (this node's figures, the default) or scope=cluster`,
		"history=yes":           `want history=1`,
		"scop=cluster":          `unknown parameter "scop": want scope=node|cluster and history=0|1`,
		"scope=node&scope=node": `scope is given 2 times; give it once`,
	} {
		res, err := http.Get(ts.URL + "/status?" + query)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), want) {
			t.Errorf("GET /status?%s: %d %q, want 400 saying %q", query, res.StatusCode, body, want)
		}
	}
}

// A standalone node's cluster scope is a cluster of itself: one member,
// answered, whose figures are the totals; with history=1 its samples add
// up to its decisions.
func TestClusterScopeOfAStandaloneNodeIsItsOwnFigures(t *testing.T) {
	login := node.Policy{Name: "login", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 2, Period: time.Hour}}
	ts := startServer(t, memory.New(nil, 0), Config{ShowKeys: true}, login)
	checkN(t, ts, "login", "mallory", nil, 5)

	// Generous: the node samples every second; 20 s covers a starved
	// ticker on a loaded machine.
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := http.Get(ts.URL + "/status?scope=cluster&history=1")
		if err != nil {
			t.Fatal(err)
		}
		var c clusterStatusJSON
		err = json.NewDecoder(res.Body).Decode(&c)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("GET /status?scope=cluster: %d, %v", res.StatusCode, err)
		}
		if c.Scope != "cluster" || c.Answered != 1 || len(c.Members) != 1 || !c.Members[0].Self || !c.Members[0].Answered || c.Members[0].OtherPolicies {
			t.Fatalf("cluster scope %+v, want this node alone, answered", c)
		}
		if len(c.Policies) != 1 || c.Policies[0].Allowed.Store != 2 || c.Policies[0].Denied.Store+c.Policies[0].Denied.DeniedCache != 3 {
			t.Fatalf("policies %+v, want login with 2 allowed and 3 denied", c.Policies)
		}
		top := c.Policies[0].TopDenied
		if top == nil || len(top.Keys) != 1 || top.Keys[0] != (topKeyJSON{Key: "mallory", Count: 3}) || top.Unlisted == nil || *top.Unlisted != 0 {
			t.Fatalf("top denied %+v, want mallory denied 3 times and nothing unlisted", top)
		}
		var allowed, denied int64
		for _, s := range c.History.Samples {
			allowed, denied = allowed+s.Allowed, denied+s.Denied
		}
		if allowed == 2 && denied == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("history adds up to %d allowed and %d denied, want 2 and 3: %+v", allowed, denied, c.History)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
