package quotadtest

import "github.com/quotad/quotad/node"

// SizedCluster is a node.Cluster of that many members that gossips
// nothing: what a node's lease caps see of a cluster, for tests that run
// several nodes without memberlist.
type SizedCluster int

var _ node.Cluster = SizedCluster(1)

// Size implements node.Cluster.
func (c SizedCluster) Size() int { return int(c) }

// Serve implements node.Cluster; nothing is ever delivered.
func (SizedCluster) Serve(node.Receiver) error { return nil }

// AnnounceDenial implements node.Cluster: it tells no one.
func (SizedCluster) AnnounceDenial(node.Denial) {}

// AnnounceReset implements node.Cluster: it tells no one.
func (SizedCluster) AnnounceReset(string, string) {}

// Status implements node.Cluster.
func (SizedCluster) Status() node.MembershipStatus { return node.MembershipStatus{} }

// Close implements node.Cluster.
func (SizedCluster) Close() error { return nil }
