package node

import (
	"strconv"
	"strings"

	"github.com/quotad/quotad/algorithms"
)

// The Redis key layout (docs/algorithms.md, "Keys"). Every key of key K
// under one policy or inline namespace N shares one Redis Cluster hash tag,
// the family:
//
//	{P:N:K}              the family of key K under policy or namespace N
//	{P:N:K}:tb3          a configured policy's state (one suffix per algorithm;
//	                     the window algorithms' one key per window, :fw4:T:S)
//	{P:N:K}/L/T/C:tb3    an inline limit's state: L units per T ms, capacity C
//	{P}:state            the state marker (the Redis store's Epoch)
//
// P is the key prefix with '%', ':' and '}' percent-encoded, N the name
// (which has none of them), K the key with '%' and '}' percent-encoded. The
// encoding is injective: the tag ends at the first '}', P at the first ':',
// N at the next, and K is the rest of the tag; after the tag comes either
// a suffix (':') or an inline limit ('/'). So two prefixes, two names or two
// keys never share state, whatever their bytes, and a
// key full of '}' still hashes on all of itself. An inline limit's
// parameters are part of its base, so a request with another limit for the
// same key gets state of its own and cannot re-window anyone's.

// keyBase is the store's key base for key under policy p: the family for a
// configured policy, the family and the limit for an inline one.
func (n *Node) keyBase(p Policy, key string) string {
	family := n.keyFamily(p.Name, key)
	if n.isConfigured(p) {
		return family
	}
	return family + inlineVariant(p.Limit)
}

// isConfigured reports whether p is a configured policy as configured: an
// inline limit, or a configured name with another limit (never sent by
// package rpc, which refuses limits under configured names), is bound to
// its limit.
func (n *Node) isConfigured(p Policy) bool {
	c, ok := n.policies.Load().Policy(p.Name)
	return ok && c.Limit == p.Limit
}

// keyFamily is the hash tag of every key of policy (or namespace) and key:
// {P:N:K}.
func (n *Node) keyFamily(policy, key string) string {
	var b strings.Builder
	b.Grow(len(n.cfg.KeyPrefix) + len(policy) + len(key) + 4)
	b.WriteByte('{')
	writeEscaped(&b, n.cfg.KeyPrefix, ":%}")
	b.WriteByte(':')
	b.WriteString(policy)
	b.WriteByte(':')
	writeEscaped(&b, key, "%}")
	b.WriteByte('}')
	return b.String()
}

// inlineVariant is what follows an inline limit's family: /L/T/C, its
// limit, period in ms and capacity. Algorithms are told apart by the
// suffix; two limits with the same capacity (a burst of 0 or of the limit)
// are the same limit.
func inlineVariant(l algorithms.Limit) string {
	b := make([]byte, 0, 48)
	b = append(b, '/')
	b = strconv.AppendInt(b, l.Limit, 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, l.PeriodMillis(), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, l.Capacity(), 10)
	return string(b)
}

// writeEscaped writes s to b with each byte of special, and '%', as %XX.
func writeEscaped(b *strings.Builder, s, special string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || strings.IndexByte(special, c) >= 0 {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

// stateMarker is the key the store may use to tell whether it lost its
// state: {P}:state. Its tag has no ':', so it is no family's.
func (n *Node) stateMarker() string {
	var b strings.Builder
	b.WriteByte('{')
	writeEscaped(&b, n.cfg.KeyPrefix, ":%}")
	b.WriteString("}:state")
	return b.String()
}

// SplitBase splits a key base into its family (the hash tag, braces
// included) and its inline variant ("" for a configured policy). A base
// without a hash tag is all family.
func SplitBase(base string) (family, variant string) {
	if i := strings.IndexByte(base, '}'); i >= 0 {
		return base[:i+1], base[i+1:]
	}
	return base, ""
}
