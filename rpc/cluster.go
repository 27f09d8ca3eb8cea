package rpc

import (
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/node"
)

// clusterJSON is the GET /cluster page: the node's view of its cluster
// and its local figures. Field names are snake_case like the rest of
// quotad's JSON; counts are totals since the node started.
type clusterJSON struct {
	// Node is this node's name; empty when standalone.
	Node      string `json:"node"`
	Clustered bool   `json:"clustered"`
	// Size is the live members lease caps divide by; LeaseShare the
	// fraction of a key's capacity this node may hold in leases.
	Size       int          `json:"size"`
	LeaseShare float64      `json:"lease_share"`
	Members    []memberJSON `json:"members"`
	Joins      struct {
		Attempts int64 `json:"attempts"`
		Contacts int64 `json:"contacts"`
		// Refused counts peers refused for another key prefix or Redis.
		Refused int64 `json:"refused"`
	} `json:"joins"`
	Gossip      gossipJSON        `json:"gossip"`
	Leases      leasesJSON        `json:"leases"`
	DeniedCache deniedCacheJSON   `json:"denied_cache"`
	Config      clusterConfigJSON `json:"config"`
}

// clusterConfigJSON is the configuration the node runs (ConfigVersion).
type clusterConfigJSON struct {
	Generation int64     `json:"generation"`
	Hash       string    `json:"hash"`
	LoadedAt   time.Time `json:"loaded_at"`
	Policies   int       `json:"policies"`
}

type memberJSON struct {
	Name  string    `json:"name"`
	Addr  string    `json:"addr"`
	State string    `json:"state"`
	Self  bool      `json:"self,omitempty"`
	Since time.Time `json:"since"`
}

type gossipJSON struct {
	DenialsSent      int64 `json:"denials_sent"`
	DenialsReceived  int64 `json:"denials_received"`
	ResetsSent       int64 `json:"resets_sent"`
	ResetsReceived   int64 `json:"resets_received"`
	DuplicateResets  int64 `json:"duplicate_resets"`
	RememberedResets int   `json:"remembered_resets"`
	Capped           int64 `json:"capped"`
	Malformed        int64 `json:"malformed"`
	Unsupported      int64 `json:"unsupported_version"`
	UnknownSender    int64 `json:"unknown_sender"`
	Replayed         int64 `json:"replayed"`
	Stale            int64 `json:"stale"`
	TooLarge         int64 `json:"too_large"`
	Dropped          int64 `json:"dropped"`
	Queued           int   `json:"queued"`
}

type leasesJSON struct {
	Granted       int64 `json:"granted"`
	UnitsLeased   int64 `json:"units_leased"`
	UnitsReturned int64 `json:"units_returned"`
	UnitsHeld     int64 `json:"units_held"`
	Hits          int64 `json:"hits"`
}

type deniedCacheJSON struct {
	DenialsCached int64  `json:"denials_cached"`
	Hits          int64  `json:"hits"`
	Lookups       uint64 `json:"lookups"`
	Cost          int64  `json:"cost"`
	MaxCost       int64  `json:"max_cost"`
	Evicted       uint64 `json:"evicted"`
}

// clusterPage serves GET /cluster for node n, whose configuration in force
// is *version.
func clusterPage(n *node.Node, version *atomic.Pointer[ConfigVersion]) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		s := n.ClusterStatus()
		v := version.Load()
		out := clusterJSON{
			Node: s.Name, Clustered: s.Members != nil, Size: s.Size, LeaseShare: s.LeaseShare,
			Members: make([]memberJSON, len(s.Members)),
			Gossip: gossipJSON{
				DenialsSent: s.Membership.Gossip.DenialsSent, DenialsReceived: s.Membership.Gossip.DenialsReceived,
				ResetsSent: s.Membership.Gossip.ResetsSent, ResetsReceived: s.Membership.Gossip.ResetsReceived,
				DuplicateResets: s.Membership.Gossip.DuplicateResets, RememberedResets: s.Membership.Gossip.RememberedResets,
				Capped: s.Membership.Gossip.Capped, Malformed: s.Membership.Gossip.Malformed, Unsupported: s.Membership.Gossip.Unsupported,
				UnknownSender: s.Membership.Gossip.UnknownSender, Replayed: s.Membership.Gossip.Replayed, Stale: s.Membership.Gossip.Stale,
				TooLarge: s.Membership.Gossip.TooLarge, Dropped: s.Membership.Gossip.Dropped, Queued: s.Membership.Gossip.Queued,
			},
			Leases: leasesJSON{
				Granted: s.Stats.LeasesGranted, UnitsLeased: s.Stats.UnitsLeased, UnitsReturned: s.Stats.UnitsReturned,
				UnitsHeld: s.Stats.UnitsHeld, Hits: s.Stats.LeaseHits,
			},
			DeniedCache: deniedCacheJSON{
				DenialsCached: s.Stats.DenialsCached, Hits: s.Stats.DeniedCacheHits,
				Lookups: s.Stats.Denied.Hits + s.Stats.Denied.Misses,
				Cost:    s.Stats.Denied.Cost, MaxCost: s.Stats.Denied.MaxCost, Evicted: s.Stats.Denied.Evicted,
			},
		}
		out.Config = clusterConfigJSON{Generation: v.Generation, Hash: v.Hash, LoadedAt: v.LoadedAt.UTC(), Policies: n.PolicySet().Len()}
		out.Joins.Attempts, out.Joins.Contacts, out.Joins.Refused = s.Membership.JoinAttempts, s.Membership.JoinContacts, s.Membership.Refused
		for i, m := range s.Members {
			out.Members[i] = memberJSON{Name: m.Name, Addr: m.Addr, State: m.State.String(), Self: m.Self, Since: m.Since.UTC()}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
	}
}
