package rpc

import (
	"encoding/json"
	"fmt"
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

// page is a member's GET /status with the given config, api's counts and
// login's top denied keys.
func page(name, digest string, generation uint64, allowed, denied int64, keys []topKeyJSON, unlisted *uint64) *statusJSON {
	g := generation
	return &statusJSON{
		Node:   name,
		Config: configJSON{Generation: &g, PoliciesSHA256: digest},
		Store:  storeJSON{Calls: allowed + denied, Breaker: "closed"},
		Policies: []policyJSON{{Name: "login", Configured: true, Allowed: sourcesJSON{Store: allowed}, Denied: sourcesJSON{Store: denied},
			TopDenied: &topDeniedJSON{Denials: uint64(denied), Keys: keys, Unlisted: unlisted}}},
	}
}

// Adding up the members' pages: counts and store calls add up, top keys
// merge with their bounds (a member that does not say what it left
// unlisted is taken at its lowest listed count), and a member on other
// policies or an older generation stands out against the digest most
// members run and the highest generation.
func TestAddingUpMembersMakesTheOddOnesStandOut(t *testing.T) {
	zero, two := uint64(0), uint64(2)
	pages := []*statusJSON{
		page("a", "aaaa", 3, 10, 5, []topKeyJSON{{Key: "x", Count: 5}}, &zero),
		page("b", "aaaa", 2, 20, 7, []topKeyJSON{{Key: "x", Count: 4}, {Key: "y", Count: 3, Error: 1}}, &two),
		page("c", "bbbb", 3, 1, 2, []topKeyJSON{{Key: "y", Count: 2}}, nil), // a quotad before unlisted
		nil, // d did not answer
	}
	out := clusterStatusJSON{Members: []memberStatusJSON{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d", Error: "refused"}}}
	addUp(&out, pages, *pages[0])

	if out.Answered != 3 || out.PoliciesSHA256 != "aaaa" || out.Generation == nil || *out.Generation != 3 || out.Store.Calls != 45 {
		t.Fatalf("answered %d, digest %s, generation %v, store calls %d; want 3, aaaa, 3, 45", out.Answered, out.PoliciesSHA256, out.Generation, out.Store.Calls)
	}
	odd := map[string][2]bool{}
	for _, m := range out.Members {
		odd[m.Name] = [2]bool{m.OtherPolicies, m.GenerationBehind}
	}
	if want := map[string][2]bool{"a": {}, "b": {false, true}, "c": {true, false}, "d": {}}; fmt.Sprint(odd) != fmt.Sprint(want) {
		t.Errorf("members standing out (other policies, behind): %v, want %v", odd, want)
	}
	if out.Members[3].Answered || out.Members[3].Error != "refused" {
		t.Errorf("the member that did not answer: %+v, want it unanswered with its error", out.Members[3])
	}
	if len(out.Policies) != 1 || out.Policies[0].Allowed.Store != 31 || out.Policies[0].Denied.Store != 14 {
		t.Fatalf("policies %+v, want login with 31 allowed and 14 denied", out.Policies)
	}
	// x: 5 on a, 4 on b, at most 2 (c's lowest listed count) on c.
	// y: at most 0 on a (all listed), 3 (≥ 2) on b, 2 on c.
	top := out.Policies[0].TopDenied
	want := []topKeyJSON{{Key: "x", Count: 11, Error: 2}, {Key: "y", Count: 5, Error: 1}}
	if top == nil || top.Denials != 14 || fmt.Sprint(top.Keys) != fmt.Sprint(want) || top.Unlisted == nil || *top.Unlisted != 4 {
		t.Fatalf("merged top %+v (unlisted %v), want 14 denials, %v, unlisted 0+2+2", top, top.Unlisted, want)
	}
}
