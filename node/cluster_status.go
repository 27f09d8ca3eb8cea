package node

import (
	"fmt"
	"time"
)

// This file is what a node reports of its cluster on status pages: the
// members as its Cluster sees them and the cluster's counters, beside the
// node's own lease and cache figures.

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
	size := max(1, n.cluster.Size())
	m := n.cluster.Status()
	return ClusterStatus{
		Name: m.Name, Members: m.Members, Membership: m.Stats,
		Size: size, LeaseShare: n.cfg.Lease.MaxFraction / float64(size), Stats: n.Stats(),
	}
}

// MembershipStatus is a Cluster's report of itself.
type MembershipStatus struct {
	// Name is this node's name in the cluster.
	Name string
	// Members is every member known, this node included, sorted by name.
	Members []Member
	// Stats counts joins, refused peers and gossip.
	Stats MembershipStats
}

// MemberState is what this node believes about a member.
type MemberState int

const (
	// MemberAlive answers probes, or failed some recently and has not yet
	// been declared dead (memberlist does not expose suspicion).
	MemberAlive MemberState = iota + 1
	// MemberDead stopped answering for DeadAfter, or was cut off by a
	// partition; the rejoin loop keeps trying its address.
	MemberDead
	// MemberLeft left the cluster on purpose (a graceful shutdown).
	MemberLeft
)

// String returns "alive", "dead" or "left".
func (s MemberState) String() string {
	switch s {
	case MemberAlive:
		return "alive"
	case MemberDead:
		return "dead"
	case MemberLeft:
		return "left"
	}
	return fmt.Sprintf("MemberState(%d)", int(s))
}

// Member is one node of the cluster as this node sees it.
type Member struct {
	// Name is the member's node name; Addr its gossip "host:port".
	Name, Addr string
	State      MemberState
	// Self marks this node.
	Self bool
	// Since is when this node last saw the member change state (joined,
	// died or left).
	Since time.Time
}

// MembershipStats counts the rejoin loop's work, refused peers and the
// gossip.
type MembershipStats struct {
	// JoinAttempts counts addresses the join and rejoin loop contacted;
	// JoinContacts those that answered and exchanged state.
	JoinAttempts, JoinContacts int64
	// Refused counts alive messages and state exchanges refused because
	// they came from, or carried, a peer with another key prefix or Redis
	// (or no quotad fingerprint).
	Refused int64
	Gossip  GossipStats
}

// GossipStats counts a node's gossip. Counts are totals since the
// membership started.
type GossipStats struct {
	// DenialsSent and ResetsSent count messages queued for the cluster;
	// DenialsReceived and ResetsReceived those received from peers, each
	// counted once applied.
	DenialsSent, ResetsSent, DenialsReceived, ResetsReceived int64
	// DuplicateResets counts retransmitted resets ignored because their id
	// was already applied.
	DuplicateResets int64
	// Capped counts received denials whose retry_after or reset_after
	// exceeded what their limit can justify (Limit.MaxRetryAfter, with
	// leases held at most one period) and were cut to it: a sign of a
	// forged message, since no store says more.
	Capped int64
	// Malformed counts packets and messages dropped because they did not
	// decode or validate; Unsupported packets of a version this node does
	// not speak.
	Malformed, Unsupported int64
	// UnknownSender counts packets dropped because their sender is not a
	// current member (never joined, refused, or a past incarnation);
	// Replayed those whose number this node had already taken from that
	// sender, or that came too far behind its newer ones; Stale those sent
	// more than GossipMaxAge before, or after, this node's clock.
	UnknownSender, Replayed, Stale int64
	// TooLarge counts denials and resets not gossiped because their
	// encoding would exceed one packet; Dropped those pruned from a full
	// queue.
	TooLarge, Dropped int64
	// Queued is the number of broadcasts waiting to go out.
	Queued int
	// RememberedResets is the number of reset ids remembered to ignore
	// retransmissions; at most 4096.
	RememberedResets int
}
