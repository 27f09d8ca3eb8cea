package cluster

import (
	"fmt"

	"github.com/quotad/quotad/node"
)

// This file is the membership as its node sees it: the node.Cluster
// methods that announce the node's denials and resets, hand it the other
// members', and report the membership on status pages.

var _ node.Cluster = (*Membership)(nil)

// Serve implements node.Cluster: the other members' denials and resets go
// to r from now on. A membership serves one node; a second is refused
// with node.ErrInvalidConfig.
func (m *Membership) Serve(r node.Receiver) error {
	if !m.gossip.recv.CompareAndSwap(nil, &receiver{r}) {
		return fmt.Errorf("cluster: %w: the membership already serves another node", node.ErrInvalidConfig)
	}
	return nil
}

// AnnounceDenial implements node.Cluster. Denials too short to arrive
// before they end are not worth a packet.
func (m *Membership) AnnounceDenial(d node.Denial) {
	if d.RetryAfter < m.cfg.gossipInterval() {
		return
	}
	m.gossip.queueDenial(denialMsg{
		policy: d.Policy, key: d.Key, limit: d.Limit, cost: d.Cost,
		retryAfter: d.RetryAfter, resetAfter: d.ResetAfter, remaining: d.Remaining,
	}, d.At, m.spreading())
}

// AnnounceReset implements node.Cluster.
func (m *Membership) AnnounceReset(policy, key string) {
	m.gossip.queueReset(policy, key, m.spreading())
}

// Status implements node.Cluster.
func (m *Membership) Status() node.MembershipStatus {
	return node.MembershipStatus{Name: m.Name(), Members: m.Members(), Stats: m.Stats()}
}
