package rpc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/quotad/quotad/node"
)

// This file is GET /status?scope=cluster: the node asked fans out one
// GET /status to each other live member, at most memberStatusConcurrency
// at a time and each within memberStatusTimeout, and adds up what they
// answer. Each member answers its own figures only, so a refresh costs
// every member one GET /status whatever the cluster's size, and the node
// asked one request per member. A member that does not answer is listed
// with the error, and the totals say how many members they cover.

// clusterStatusJSON is GET /status?scope=cluster: the cluster's figures,
// added up over the members that answered.
type clusterStatusJSON struct {
	// Scope is "cluster".
	Scope string `json:"scope"`
	// Node is the member that asked the others.
	Node string    `json:"node"`
	Now  time.Time `json:"now"`
	// Members are every member the node asked knows of, sorted by name;
	// Answered counts those whose figures the totals include.
	Members  []memberStatusJSON `json:"members"`
	Answered int                `json:"answered"`
	// PoliciesSHA256 is the digest of the policies most answering members
	// run (ties: the node asked); a member with another stands out.
	PoliciesSHA256 string `json:"policies_sha256"`
	// Generation is the highest config generation among the answering
	// members; a member below it stands out.
	Generation *uint64          `json:"generation"`
	Store      clusterStoreJSON `json:"store"`
	// Keys and TopDeniedWindow are the node asked's (members should
	// share --console-show-keys, or their keys do not add up).
	Keys            string `json:"keys"`
	TopDeniedWindow string `json:"top_denied_window"`
	// Policies add up the answering members' decisions per policy,
	// outcome and source; each top_denied merges theirs (topkeys.Merge).
	Policies []policyJSON `json:"policies"`
	// History adds up the answering members' samples per second, only
	// with ?history=1.
	History *historyJSON `json:"history,omitempty"`
}

// clusterStoreJSON adds up the answering members' store figures.
type clusterStoreJSON struct {
	Describe  string `json:"describe"`
	Calls     int64  `json:"calls"`
	Errors    int64  `json:"errors"`
	Overloads int64  `json:"overloads"`
	// BreakersOpen counts the answering members whose breaker is open.
	BreakersOpen int `json:"breakers_open"`
}

// memberStatusJSON is one member in GET /status?scope=cluster.
type memberStatusJSON struct {
	Name string `json:"name"`
	// Addr is the member's gossip address; API the base URL asked (empty
	// for the node asked, which reads its own figures).
	Addr string `json:"addr"`
	API  string `json:"api"`
	// State is the member as gossip sees it: alive, dead or left.
	State string `json:"state"`
	Self  bool   `json:"self,omitempty"`
	// Answered says the member's figures are in the totals; Error says
	// why not.
	Answered bool   `json:"answered"`
	Error    string `json:"error,omitempty"`
	// The member's own figures, when it answered.
	Now    *time.Time  `json:"now,omitempty"`
	Config *configJSON `json:"config,omitempty"`
	// OtherPolicies: it runs policies other than PoliciesSHA256;
	// GenerationBehind: its config generation is below the highest.
	OtherPolicies    bool              `json:"other_policies"`
	GenerationBehind bool              `json:"generation_behind"`
	Store            *storeJSON        `json:"store,omitempty"`
	Policies         []memberCountJSON `json:"policies,omitempty"`
}

// memberCountJSON is one policy's decisions on one member, from which the
// console computes the member's rates.
type memberCountJSON struct {
	Name    string      `json:"name"`
	Allowed sourcesJSON `json:"allowed"`
	Denied  sourcesJSON `json:"denied"`
}

// clusterStatus asks every other live member for its figures and adds
// them up with this node's. It returns when every member answered or
// failed; each takes at most memberStatusTimeout.
func (a *memberAsker) clusterStatus(ctx context.Context, n *node.Node, cfg Config, started time.Time, history bool) clusterStatusJSON {
	self := status(n, cfg, started)
	if history {
		self.History = nodeHistory(n)
	}
	cs := n.ClusterStatus()
	members := cs.Members
	if members == nil { // standalone: a cluster of this node alone
		members = []node.Member{{Name: cs.Name, State: node.MemberAlive, Self: true, Since: started}}
	}
	out := clusterStatusJSON{Scope: "cluster", Node: self.Node, Now: self.Now, Keys: self.Keys, TopDeniedWindow: self.TopDeniedWindow,
		Members: make([]memberStatusJSON, len(members))}
	pages := make([]*statusJSON, len(members))
	sem := make(chan struct{}, memberStatusConcurrency)
	var wg sync.WaitGroup
	for i, m := range members {
		out.Members[i] = memberStatusJSON{Name: m.Name, Addr: m.Addr, State: m.State.String(), Self: m.Self}
		switch {
		case m.Self:
			pages[i] = &self
		case m.State != node.MemberAlive:
			out.Members[i].Error = fmt.Sprintf("not asked: %s in this node's view of the cluster since %s", m.State, m.Since.UTC().Format(time.RFC3339))
		default:
			base, err := a.baseURL(m.Addr)
			if err != nil {
				out.Members[i].Error = err.Error()
				continue
			}
			out.Members[i].API = base
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				page, err := a.ask(ctx, base, m.Name, history)
				if err != nil {
					out.Members[i].Error = err.Error()
					return
				}
				pages[i] = page
			}()
		}
	}
	wg.Wait()
	addUp(&out, pages, self)
	return out
}
