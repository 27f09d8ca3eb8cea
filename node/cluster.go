package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
)

// ErrSharedStoreRequired is returned by New for a node given a cluster
// membership but a store that only it can see.
var ErrSharedStoreRequired = errors.New("a cluster needs a shared store")

// attachCluster makes n the node that m's received gossip applies to.
func (n *Node) attachCluster(m *Membership) error {
	if !n.store.Remote() {
		// Every node on its own memory store would admit the whole limit:
		// a cluster of k such nodes admits k times it.
		return fmt.Errorf("cluster: %w: the embedded memory store (%s) is private to each node, so a cluster would admit the limit once per node; configure Redis", ErrSharedStoreRequired, n.store.Describe())
	}
	if !m.gossip.recv.CompareAndSwap(nil, n) {
		return fmt.Errorf("cluster: %w: the membership already serves another node", ErrInvalidConfig)
	}
	return nil
}

// gossipDenial tells the cluster that the store denied cost units of k
// under lim with d, measured from start (node clock). Denials too short
// to arrive before they end are not worth a packet.
func (n *Node) gossipDenial(k leaseKey, lim algorithms.Limit, cost int64, d algorithms.Decision, start int64) {
	m := n.cfg.Cluster
	if m == nil || d.RetryAfter < m.cfg.gossipInterval() {
		return
	}
	m.gossip.queueDenial(denialMsg{
		policy: k.policy, key: k.key, limit: lim, cost: cost,
		retryAfter: d.RetryAfter, resetAfter: d.ResetAfter, remaining: d.Remaining,
	}, n.epoch.Add(time.Duration(start)))
}

// gossipReset tells the cluster that key was reset at the store.
func (n *Node) gossipReset(policy, key string) {
	if m := n.cfg.Cluster; m != nil {
		m.gossip.queueReset(policy, key)
	}
}

// applyDenial remembers a denial a peer got from the store, so that this
// node answers the key from its denied cache too. The denied cache's rules
// hold as for its own denials: only the same limit, only the costs whose
// wait the denial determines, only until that wait runs out. It waits for the cache
// to apply the entry (microseconds), so that once the gossip counters show
// the denial, checks see it.
func (n *Node) applyDenial(m denialMsg) {
	d := algorithms.Decision{Limit: m.limit.Capacity(), Remaining: m.remaining, ResetAfter: m.resetAfter, RetryAfter: m.retryAfter}
	n.denied.Add(cache.Key{Policy: m.policy, Key: m.key, Limit: m.limit}, m.cost, d, n.clock()/int64(time.Millisecond))
	n.denied.Wait()
}

// applyReset drops this node's lease and remembered denials of a key that
// a peer reset at the store. It is not gossiped on: the peer did that.
func (n *Node) applyReset(policy, key string) {
	n.forgetLocal(policy, key)
}

// ClusterStatus is a node's view of its cluster and its own local
// pre-aggregation, for status pages.
type ClusterStatus struct {
	// Name is this node's name in the cluster; empty when standalone.
	Name string
	// Members is every member this node knows of, itself included, sorted
	// by name; nil when standalone.
	Members []Member
	// Size is the cluster size lease caps divide by: the live members.
	Size int
	// LeaseShare is the fraction of a key's capacity this node may hold in
	// leases: MaxFraction / Size.
	LeaseShare float64
	// Membership counts joins and gossip; zero when standalone.
	Membership MembershipStats
	// Stats are this node's lease and denied-cache counters.
	Stats Stats
}

// ClusterStatus returns the node's view of the cluster and its counters.
func (n *Node) ClusterStatus() ClusterStatus {
	size := max(1, n.clusterSize())
	s := ClusterStatus{Size: size, LeaseShare: n.lcfg.MaxFraction / float64(size), Stats: n.Stats()}
	if m := n.cfg.Cluster; m != nil {
		s.Name, s.Members, s.Membership = m.Name(), m.Members(), m.Stats()
	}
	return s
}
