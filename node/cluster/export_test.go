package cluster

// GossipID is m's gossip sender id. In a cluster without a key it travels
// in plaintext in every alive message, so an attacker on the network knows
// it; the attack tests use it to impersonate a member.
func GossipID(m *Membership) uint64 { return m.gossip.id }

// SetGossipFanout makes m send each spread packet to k random members a
// round; with k at least its peers it sends every message to every
// member, as a small cluster does.
func SetGossipFanout(m *Membership, k int) { m.spreadFanout.Store(int32(k)) }

// GossipFanout is how many random members a spread packet goes to each
// round, unless a test sets another.
const GossipFanout = gossipFanout

// SpreadSendsPerMessage is the most packets a member sends for one
// message it spreads in a cluster of n members: the fan-out times the
// rounds.
func SpreadSendsPerMessage(n int) int { return gossipFanout * spreadRounds(n) }
