package rpc

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc/rlqs"
	"github.com/quotad/quotad/topkeys"
)

// statusJSON is the GET /status page: this node's live figures, what the
// console's Live view shows. Counts are totals since the node started;
// a rate is the difference between two reads divided by the difference of
// their "now". Field names are snake_case like the rest of quotad's JSON.
type statusJSON struct {
	// Node is this node's name in its cluster; empty when standalone.
	Node    string       `json:"node"`
	Now     time.Time    `json:"now"`
	Config  configJSON   `json:"config"`
	Store   storeJSON    `json:"store"`
	Cluster clusterBrief `json:"cluster"`
	Leases  leasesJSON   `json:"leases"`
	// ClientLeases are the leases this node granted to clients in local
	// mode (AcquireLease), which they spend in their own processes.
	ClientLeases clientLeasesJSON `json:"client_leases"`
	DeniedCache  deniedCacheJSON  `json:"denied_cache"`
	// Keys says how keys are shown in top_denied: "sha256", each replaced
	// by "sha256:" and the first 16 hex digits of its SHA-256 (the
	// default), or "shown" with Config.ShowKeys.
	Keys string `json:"keys"`
	// TopDeniedWindow is how far back top_denied reaches at most.
	TopDeniedWindow string `json:"top_denied_window"`
	// TopDeniedUntracked counts denials under policies past the sketch's
	// bound, which no top_denied shows.
	TopDeniedUntracked uint64       `json:"top_denied_untracked"`
	Policies           []policyJSON `json:"policies"`
	// RLQS is Envoy's rate limit quota service on this node, when it is
	// served: its streams, rounds and store calls, and each limit its
	// Envoys share (keys shown as in top_denied).
	RLQS *rlqs.Status `json:"rlqs,omitempty"`
	// History is the last minutes of this node's rates, only with
	// ?history=1.
	History *historyJSON `json:"history,omitempty"`
}

// configJSON is the configuration the node runs.
type configJSON struct {
	// Generation counts the configurations loaded, 1 for the one at start;
	// null when nothing tracks generations (no hot reload).
	Generation *uint64 `json:"generation"`
	// LoadedAt is when that configuration was loaded; without generations,
	// when the API handler was built, that is, when quotad started.
	LoadedAt time.Time `json:"loaded_at"`
	// Policies counts the configured policies; PoliciesSHA256 identifies
	// them (name, algorithm, limit, period, burst, failure and lease modes),
	// so that nodes running the same policies show the same digest.
	Policies       int    `json:"policies"`
	PoliciesSHA256 string `json:"policies_sha256"`
	InlineLimits   bool   `json:"inline_limits"`
}

// clientLeasesJSON is node.ClientLeaseStats: totals since the node
// started, and the grants it remembers now (outstanding: neither returned
// nor forgotten a second after they expired) with their units.
type clientLeasesJSON struct {
	Granted       int64 `json:"granted"`
	UnitsLeased   int64 `json:"units_leased"`
	UnitsReturned int64 `json:"units_returned"`
	Outstanding   int   `json:"outstanding"`
	UnitsHeld     int64 `json:"units_held"`
}

// storeJSON is the store, its calls and its breaker.
type storeJSON struct {
	// Describe says which store it is, e.g. "redis 127.0.0.1:6379 db 0".
	Describe string `json:"describe"`
	// Calls counts calls sent to a remote store (0 for the memory store).
	Calls int64 `json:"calls"`
	// Breaker is "closed", "open", or "none" for the memory store.
	Breaker      string `json:"breaker"`
	BreakerOpens int64  `json:"breaker_opens"`
	Errors       int64  `json:"errors"`
	// Overloads counts the calls whose deadline passed inside the node
	// while the store answered: their checks were shed as overloaded,
	// not counted as errors nor answered by a failure mode.
	Overloads int64 `json:"overloads"`
}

// clusterBrief is the part of GET /cluster the Live view shows.
type clusterBrief struct {
	Clustered bool         `json:"clustered"`
	Size      int          `json:"size"`
	Members   []memberJSON `json:"members"`
}

// policyJSON is one policy's (or inline namespace's) figures.
type policyJSON struct {
	Name       string `json:"name"`
	Configured bool   `json:"configured"`
	// Limit is a configured policy's limit; inline namespaces have none.
	Limit     *limitJSON     `json:"limit,omitempty"`
	Allowed   sourcesJSON    `json:"allowed"`
	Denied    sourcesJSON    `json:"denied"`
	TopDenied *topDeniedJSON `json:"top_denied,omitempty"`
}

type limitJSON struct {
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	Period    string `json:"period"`
	Burst     int64  `json:"burst,omitempty"`
}

type sourcesJSON struct {
	Store       int64 `json:"store"`
	Lease       int64 `json:"lease"`
	DeniedCache int64 `json:"denied_cache"`
	FailOpen    int64 `json:"fail_open"`
	FailClosed  int64 `json:"fail_closed"`
}

// topDeniedJSON is a policy's keys denied most within top_denied_window.
type topDeniedJSON struct {
	// Denials counts the policy's denials in the window, exactly.
	Denials uint64 `json:"denials"`
	// Keys are the most denied first; each key's true count is between
	// count − error and count.
	Keys []topKeyJSON `json:"keys"`
	// Unlisted is the most a key not in Keys may have been denied in the
	// window (topkeys.PolicyTop.Unlisted); 0 when every key denied is
	// listed. A pointer so that the answer of a quotad that does not
	// write it is told apart when members' reports are merged.
	Unlisted *uint64 `json:"unlisted"`
}

type topKeyJSON struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
}

// statusPage serves GET /status: this node's figures, or with
// ?scope=cluster every member's (status_cluster.go); ?history=1 adds the
// last minutes of samples (status_history.go). started stands in for the
// config's load time when cfg.ConfigGeneration is nil.
func statusPage(n *node.Node, cfg Config, started time.Time, members *memberAsker) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, err := parseStatusQuery(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var out any
		if q.cluster {
			out = members.clusterStatus(r.Context(), n, cfg, started, q.history)
		} else {
			st := status(n, cfg, started)
			if q.history {
				st.History = nodeHistory(n)
			}
			out = st
		}
		writeStatusJSON(w, out)
	}
}

// writeStatusJSON writes a status page, pretty-printed, never cached.
func writeStatusJSON(w http.ResponseWriter, out any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

func status(n *node.Node, cfg Config, started time.Time) statusJSON {
	cs := n.ClusterStatus()
	st := cs.Stats
	cl := n.ClientLeaseStats()
	configured := n.Policies()
	out := statusJSON{
		Node: cs.Name, Now: time.Now().UTC(),
		Config: configJSON{
			LoadedAt: started.UTC(), Policies: len(configured), PoliciesSHA256: policiesDigest(configured),
			InlineLimits: !cfg.DisableInlineLimits,
		},
		Store:   storeJSON{Describe: n.Store(), Calls: st.StoreCalls, Breaker: "none", BreakerOpens: st.BreakerOpens, Errors: st.StoreErrors, Overloads: st.StoreOverloads},
		Cluster: clusterBrief{Clustered: cs.Members != nil, Size: cs.Size, Members: make([]memberJSON, len(cs.Members))},
		Leases: leasesJSON{
			Granted: st.LeasesGranted, UnitsLeased: st.UnitsLeased, UnitsReturned: st.UnitsReturned,
			UnitsHeld: st.UnitsHeld, Hits: st.LeaseHits,
		},
		ClientLeases: clientLeasesJSON{
			Granted: cl.Granted, UnitsLeased: cl.UnitsGranted, UnitsReturned: cl.UnitsReturned,
			Outstanding: cl.Grants, UnitsHeld: cl.UnitsHeld,
		},
		DeniedCache: deniedCacheJSON{
			DenialsCached: st.DenialsCached, Hits: st.DeniedCacheHits, Lookups: st.Denied.Hits + st.Denied.Misses,
			Cost: st.Denied.Cost, MaxCost: st.Denied.MaxCost, Evicted: st.Denied.Evicted,
		},
		Keys: "sha256",
	}
	if cfg.ConfigGeneration != nil {
		gen, loaded := cfg.ConfigGeneration()
		out.Config.Generation, out.Config.LoadedAt = &gen, loaded.UTC()
	}
	if st.Breaker {
		out.Store.Breaker = "closed"
		if st.BreakerOpen {
			out.Store.Breaker = "open"
		}
	}
	for i, m := range cs.Members {
		out.Cluster.Members[i] = memberJSON{Name: m.Name, Addr: m.Addr, State: m.State.String(), Self: m.Self, Since: m.Since.UTC()}
	}
	if cfg.ShowKeys {
		out.Keys = "shown"
	}

	limits := make(map[string]*limitJSON, len(configured))
	for _, p := range configured {
		limits[p.Name] = &limitJSON{Algorithm: p.Limit.Algorithm.String(), Limit: p.Limit.Limit, Period: p.Limit.Period.String(), Burst: p.Limit.Burst}
	}
	top := n.TopDenied()
	out.TopDeniedWindow = (time.Duration(top.Intervals) * node.TopDeniedInterval).String()
	out.TopDeniedUntracked = top.Untracked
	tops := make(map[string]topkeys.PolicyTop, len(top.Policies))
	for _, p := range top.Policies {
		tops[p.Policy] = p
	}
	out.Policies = []policyJSON{}
	for _, d := range n.Decisions() {
		p := policyJSON{Name: d.Policy, Configured: d.Configured, Limit: limits[d.Policy], Allowed: sources(d.Allowed), Denied: sources(d.Denied)}
		if t, ok := tops[d.Policy]; ok {
			p.TopDenied = &topDeniedJSON{Denials: t.Denials, Keys: make([]topKeyJSON, len(t.Keys)), Unlisted: &t.Unlisted}
			for i, e := range t.Keys {
				k := e.Key
				if !cfg.ShowKeys {
					k = hashKey(k)
				}
				p.TopDenied.Keys[i] = topKeyJSON{Key: k, Count: e.Count, Error: e.Error}
			}
		}
		out.Policies = append(out.Policies, p)
	}
	if cfg.RLQS != nil {
		rs := cfg.RLQS.Status()
		if !cfg.ShowKeys {
			for i := range rs.Limits {
				rs.Limits[i].Key = hashKey(rs.Limits[i].Key)
			}
		}
		out.RLQS = &rs
	}
	return out
}

func sources(c node.SourceCounts) sourcesJSON {
	return sourcesJSON{Store: c.Store, Lease: c.Lease, DeniedCache: c.DeniedCache, FailOpen: c.FailOpen, FailClosed: c.FailClosed}
}

// hashKey is what GET /status shows instead of a key without
// --console-show-keys: the
// first 16 hex digits of its SHA-256, the same on every node. It hides a
// key from whoever reads the page, not from someone who can guess it
// (an IPv4 address is found by trying them all).
func hashKey(k string) string {
	sum := sha256.Sum256([]byte(k))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// policiesDigest identifies a set of configured policies (sorted by name).
func policiesDigest(ps []node.Policy) string {
	h := sha256.New()
	for _, p := range ps {
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%d\x00%d\x00%s\x00%s\n", p.Name, p.Limit.Algorithm, p.Limit.Limit,
			p.Limit.Period.Milliseconds(), p.Limit.Burst, p.OnStoreError, p.Lease)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
