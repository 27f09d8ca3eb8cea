// Package cluster is a node's membership in a quotad cluster, on
// hashicorp/memberlist (the only package that imports it). Membership
// implements node.Cluster: it counts the live members for lease caps,
// gossips the node's denials and resets (to every member in a cluster of
// up to four, through relays to a few random members a round in a larger
// one) and hands the others' to the node, and heals partitions. It holds:
//
//   - Config and New, which start a member (config.go, membership.go);
//   - the member table fed by memberlist's events, and the rejoin loop
//     (members.go, rejoin.go);
//   - each member's metadata: the fingerprint of the data it limits, its
//     gossip id, its leaving mark (meta.go);
//   - the gossip: the wire codec (wire.go), the send queue and its rounds
//     (queue.go, send.go), the spread through relays (spread.go), and the
//     receiving side, which admits packets only from members, once each
//     and while fresh (receive.go, replay.go);
//   - the adapter of memberlist's log lines (log.go).
package cluster
