package node

import "time"

// SampleHistory takes one history sample as if the node's ticker fired
// at now, so that tests can fill the ring without waiting minutes.
func (n *Node) SampleHistory(now time.Time) { n.sampleHistory(now) }
