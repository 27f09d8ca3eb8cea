package rpc

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/topkeys"
)

// This file is GET /status?scope=cluster: the node asked fans out one
// GET /status to each other live member, at most memberStatusConcurrency
// at a time and each within memberStatusTimeout, and adds up what they
// answer. Each member answers its own figures only, so a refresh costs
// every member one GET /status whatever the cluster's size, and the node
// asked one request per member. A member that does not answer is listed
// with the error, and the totals say how many members they cover.

// Bounds of the fan-out.
const (
	// memberStatusTimeout bounds one member's answer: a member that takes
	// longer is shown as not answering, with the timeout.
	memberStatusTimeout = 2 * time.Second
	// memberStatusConcurrency bounds the members asked at once.
	memberStatusConcurrency = 8
	// maxMemberStatusBytes bounds one member's answer; a member's page is
	// a few KiB per policy.
	maxMemberStatusBytes = 4 << 20
)

// MembersConfig says how a node reaches the other members' GET /status
// for GET /status?scope=cluster. The zero value asks each member over
// plain HTTP on the port of Config.Listen.
type MembersConfig struct {
	// APIPort is the port of every member's API, joined to the host of the
	// gossip address the member advertises to the cluster. 0 means the
	// port of Config.Listen: every member listens on the same port.
	APIPort int
	// TLS, when not nil, makes the requests HTTPS with these settings:
	// the roots the members' certificates are verified against (for the
	// member's gossip host, usually an IP address) and the certificate to
	// present to members that require one. nil asks over plain HTTP.
	TLS *tls.Config
}

// memberAsker asks members for their GET /status. Safe for concurrent
// use.
type memberAsker struct {
	client *http.Client
	scheme string
	// port is the members' API port; empty when it is unknown (Listen
	// with port 0 and no APIPort).
	port string
}

func newMemberAsker(cfg MembersConfig, listen string) *memberAsker {
	port := ""
	if cfg.APIPort != 0 {
		port = strconv.Itoa(cfg.APIPort)
	} else if _, p, err := net.SplitHostPort(listen); err == nil && p != "0" {
		port = p
	} else if listen == "" {
		port = "8080"
	}
	tr := &http.Transport{
		Proxy:               nil, // members are reached directly, never through HTTP_PROXY
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     time.Minute,
		ForceAttemptHTTP2:   true,
		TLSClientConfig:     cfg.TLS,
	}
	scheme := "http"
	if cfg.TLS != nil {
		scheme = "https"
	}
	return &memberAsker{client: &http.Client{Transport: tr}, scheme: scheme, port: port}
}

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

// baseURL is the member's API URL: its gossip host and the API port.
func (a *memberAsker) baseURL(gossipAddr string) (string, error) {
	host, _, err := net.SplitHostPort(gossipAddr)
	if err != nil {
		return "", fmt.Errorf("not asked: its gossip address %q has no host to reach its API at", gossipAddr)
	}
	if a.port == "" {
		return "", errors.New("not asked: the members' API port is unknown (this node listens on port 0); set --cluster-api-port")
	}
	return a.scheme + "://" + net.JoinHostPort(host, a.port), nil
}

// ask reads one member's GET /status at base. The member must answer as
// name: another name means the API port points at another node.
func (a *memberAsker) ask(ctx context.Context, base, name string, history bool) (*statusJSON, error) {
	ctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
	defer cancel()
	u := base + "/status"
	if history {
		u += "?history=1"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	res, err := a.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("GET %s: no answer within %s", u, memberStatusTimeout)
		}
		// url.Error repeats the method and URL this message starts with.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		var dial *net.OpError
		if errors.As(err, &dial) && dial.Op == "dial" {
			return nil, fmt.Errorf("GET %s: %w (the member's API is asked at its gossip host and --cluster-api-port, default the port of --listen)", u, err)
		}
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxMemberStatusBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading the answer: %w", u, err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", u, res.Status, strings.TrimSpace(string(body[:min(len(body), 300)])))
	}
	if len(body) > maxMemberStatusBytes {
		return nil, fmt.Errorf("GET %s: the answer is over %d bytes", u, maxMemberStatusBytes)
	}
	var page statusJSON
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, fmt.Errorf("GET %s: not a quotad status page: %w", u, err)
	}
	if page.Node != name {
		return nil, fmt.Errorf("GET %s: answered as %q, not %q: the members' API port (--cluster-api-port) reaches another node", u, page.Node, name)
	}
	return &page, nil
}

// addUp fills out's totals from the pages of the members that answered
// (pages[i] is out.Members[i]'s, nil when it did not answer).
func addUp(out *clusterStatusJSON, pages []*statusJSON, self statusJSON) {
	digests := map[string]int{}
	var histories []*historyJSON
	for i, p := range pages {
		if p == nil {
			continue
		}
		out.Answered++
		digests[p.Config.PoliciesSHA256]++
		if g := p.Config.Generation; g != nil && (out.Generation == nil || *g > *out.Generation) {
			v := *g
			out.Generation = &v
		}
		m := &out.Members[i]
		m.Answered, m.Error = true, ""
		m.Now, m.Config, m.Store = &p.Now, &p.Config, &p.Store
		m.Policies = make([]memberCountJSON, len(p.Policies))
		for j, pol := range p.Policies {
			m.Policies[j] = memberCountJSON{Name: pol.Name, Allowed: pol.Allowed, Denied: pol.Denied}
		}
		out.Store.Calls += p.Store.Calls
		out.Store.Errors += p.Store.Errors
		out.Store.Overloads += p.Store.Overloads
		if p.Store.Breaker == "open" {
			out.Store.BreakersOpen++
		}
		histories = append(histories, p.History)
	}
	out.Store.Describe = self.Store.Describe
	// The digest most members run; on a tie the node asked's, else the
	// least in order, so that the answer does not depend on map order.
	out.PoliciesSHA256 = self.Config.PoliciesSHA256
	for d, c := range digests {
		best := digests[out.PoliciesSHA256]
		if c > best || (c == best && out.PoliciesSHA256 != self.Config.PoliciesSHA256 && d < out.PoliciesSHA256) {
			out.PoliciesSHA256 = d
		}
	}
	for i := range out.Members {
		m := &out.Members[i]
		if m.Config == nil {
			continue
		}
		m.OtherPolicies = m.Config.PoliciesSHA256 != out.PoliciesSHA256
		m.GenerationBehind = m.Config.Generation != nil && out.Generation != nil && *m.Config.Generation < *out.Generation
	}
	out.Policies = addUpPolicies(pages, self)
	if self.History != nil {
		out.History = sumHistories(histories)
	}
}

// addUpPolicies adds up the pages' decisions per policy and merges their
// top denied keys. A policy's limit is the node asked's, else the first
// member's that has it.
func addUpPolicies(pages []*statusJSON, self statusJSON) []policyJSON {
	byName := map[string]*policyJSON{}
	tops := map[string][]topkeys.PolicyTop{}
	limit := map[string]int{}
	for _, p := range pages {
		if p == nil {
			continue
		}
		for _, pol := range p.Policies {
			sum := byName[pol.Name]
			if sum == nil {
				sum = &policyJSON{Name: pol.Name}
				byName[pol.Name] = sum
			}
			sum.Configured = sum.Configured || pol.Configured
			if sum.Limit == nil {
				sum.Limit = pol.Limit
			}
			sum.Allowed = addSources(sum.Allowed, pol.Allowed)
			sum.Denied = addSources(sum.Denied, pol.Denied)
			if t := pol.TopDenied; t != nil {
				tops[pol.Name] = append(tops[pol.Name], memberTop(pol.Name, t))
				limit[pol.Name] = max(limit[pol.Name], len(t.Keys))
			}
		}
	}
	for _, pol := range self.Policies {
		if pol.Limit != nil {
			byName[pol.Name].Limit = pol.Limit
		}
	}
	out := make([]policyJSON, 0, len(byName))
	for name, p := range byName {
		if ts := tops[name]; len(ts) > 0 {
			m := topkeys.Merge(name, ts, limit[name])
			p.TopDenied = &topDeniedJSON{Denials: m.Denials, Keys: make([]topKeyJSON, len(m.Keys)), Unlisted: &m.Unlisted}
			for i, e := range m.Keys {
				p.TopDenied.Keys[i] = topKeyJSON{Key: e.Key, Count: e.Count, Error: e.Error}
			}
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b policyJSON) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// memberTop is a member's top_denied as topkeys reports it. A member that
// does not say how often an unlisted key may have been denied (a quotad
// older than this one) is taken at its lowest listed count, which bounds
// every key it did not list.
func memberTop(policy string, t *topDeniedJSON) topkeys.PolicyTop {
	top := topkeys.PolicyTop{Policy: policy, Denials: t.Denials, Keys: make([]topkeys.Entry, len(t.Keys))}
	for i, k := range t.Keys {
		top.Keys[i] = topkeys.Entry{Key: k.Key, Count: k.Count, Error: k.Error}
	}
	switch {
	case t.Unlisted != nil:
		top.Unlisted = *t.Unlisted
	case len(t.Keys) > 0:
		top.Unlisted = t.Keys[len(t.Keys)-1].Count
	}
	return top
}

func addSources(a, b sourcesJSON) sourcesJSON {
	return sourcesJSON{Store: a.Store + b.Store, Lease: a.Lease + b.Lease, DeniedCache: a.DeniedCache + b.DeniedCache,
		FailOpen: a.FailOpen + b.FailOpen, FailClosed: a.FailClosed + b.FailClosed}
}
