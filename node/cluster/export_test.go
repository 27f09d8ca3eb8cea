package cluster

// GossipID is m's gossip sender id. In a cluster without a key it travels
// in plaintext in every alive message, so an attacker on the network knows
// it; the attack tests use it to impersonate a member.
func GossipID(m *Membership) uint64 { return m.gossip.id }
