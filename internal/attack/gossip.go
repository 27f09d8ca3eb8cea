package attack

import (
	"encoding/binary"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// Gossip packets as docs/cluster.md specifies them, written out here
// independently of node's encoder, so that an attacker's packets are what
// the documentation says a packet is.

// GossipPacket encodes a gossip packet (version 2) from sender, numbered
// seq, sent at sent, carrying msgs.
func GossipPacket(sender, seq uint64, sent time.Time, msgs ...[]byte) []byte {
	b := []byte{2}
	b = binary.BigEndian.AppendUint64(b, sender)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint64(b, uint64(sent.UnixMilli()))
	for _, m := range msgs {
		b = append(binary.AppendUvarint(b, uint64(len(m))), m...)
	}
	return b
}

func appendStr(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// DenialMessage encodes a denial of cost under lim for retry (and reset).
func DenialMessage(policy, key string, lim algorithms.Limit, cost int64, retry time.Duration) []byte {
	b := appendStr(appendStr([]byte{1}, policy), key)
	b = append(b, byte(lim.Algorithm))
	for _, v := range []int64{lim.Limit, lim.PeriodMillis(), lim.Burst, cost, retry.Milliseconds(), retry.Milliseconds(), 0} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	return b
}

// ResetMessage encodes a reset of key with id.
func ResetMessage(id uint64, policy, key string) []byte {
	return appendStr(appendStr(binary.BigEndian.AppendUint64([]byte{2}, id), policy), key)
}
