package node

import (
	"errors"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// This file is the node's side of a cluster: the Cluster interface it is
// given (package node/cluster implements it on hashicorp/memberlist), what
// the node announces through it, and the Receiver through which it applies
// what the other members announce. A node without a cluster is a cluster
// of one (standalone).

// ErrSharedStoreRequired is returned by New for a node given a cluster
// membership but a store that only it can see.
var ErrSharedStoreRequired = errors.New("a cluster needs a shared store")

// Cluster is a node's membership in a cluster of nodes that share its
// store. The node divides lease caps by Size, announces the store's
// denials and its resets to the other members, and applies theirs, which
// the cluster hands to the Receiver given to Serve. Methods are safe for
// concurrent use and do not block, except Close.
type Cluster interface {
	// Size is the number of live members, this node included, at least
	// 1. The node reads it on the store path, so it must be cheap.
	Size() int
	// Serve makes r the receiver of what the other members announce from
	// now on. New calls it once; a cluster serves one node, and refuses a
	// second with an error.
	Serve(r Receiver) error
	// AnnounceDenial tells the other members that the store denied d. A
	// cluster may leave out denials too short to arrive before they end.
	AnnounceDenial(d Denial)
	// AnnounceReset tells the other members that key was reset under
	// policy (a policy's name or an inline namespace) at the store.
	AnnounceReset(policy, key string)
	// Status describes the membership for status pages.
	Status() MembershipStatus
	// Close leaves the cluster. Node.Close calls it once, after giving its
	// leases back, so that until then the node counts in the others'
	// lease caps.
	Close() error
}

// Receiver is where a Cluster delivers what the other members announce: the
// node, which remembers their denials and forgets what they reset. Its
// methods are safe for concurrent use and do not block.
type Receiver interface {
	// ApplyDenial remembers a denial another member got from the store, so
	// that this node answers the key from its denied cache too, under the
	// cache's rules (the same limit, only the costs whose wait the denial
	// determines, only until that wait runs out).
	ApplyDenial(d Denial)
	// ApplyReset drops this node's lease and remembered denials of a key
	// another member reset at the store.
	ApplyReset(policy, key string)
}

// Denial is the store's denial of Cost units of Key under Policy's Limit:
// checks of at least Cost are denied for RetryAfter after At. Remaining and
// ResetAfter are the rest of the store's decision.
type Denial struct {
	// Policy is a configured policy's name or an inline namespace.
	Policy, Key string
	Limit       algorithms.Limit
	// Cost is the denied cost, at least 1.
	Cost                   int64
	RetryAfter, ResetAfter time.Duration
	Remaining              int64
	// At is when RetryAfter and ResetAfter started: a reading with a
	// monotonic clock, so that a step of the wall clock changes nothing.
	At time.Time
}

// announceDenial tells the cluster that the store denied cost units of k
// under lim with d, measured from start (node clock).
func (n *Node) announceDenial(k leaseKey, lim algorithms.Limit, cost int64, d algorithms.Decision, start int64) {
	n.cluster.AnnounceDenial(Denial{
		Policy: k.policy, Key: k.key, Limit: lim, Cost: cost,
		RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter, Remaining: d.Remaining,
		At: n.epoch.Add(time.Duration(start)),
	})
}

// receiver is the node as its cluster sees it.
type receiver struct{ n *Node }

// ApplyDenial implements Receiver. Once it returns, checks see the denial
// (the local layer waits for its cache).
func (r receiver) ApplyDenial(m Denial) {
	d := algorithms.Decision{Limit: m.Limit.Capacity(), Remaining: m.Remaining, ResetAfter: m.ResetAfter, RetryAfter: m.RetryAfter}
	r.n.local.applyDenial(leaseKey{m.Policy, m.Key}, m.Limit, m.Cost, d, int64(m.At.Sub(r.n.epoch)))
}

// ApplyReset implements Receiver. It is not announced again: the member
// that reset the key did that.
func (r receiver) ApplyReset(policy, key string) { r.n.local.forget(policy, key) }

// standalone is the Cluster of a node without one: a cluster of one, with
// nobody to tell anything.
type standalone struct{}

func (standalone) Size() int                    { return 1 }
func (standalone) Serve(Receiver) error         { return nil }
func (standalone) AnnounceDenial(Denial)        {}
func (standalone) AnnounceReset(string, string) {}
func (standalone) Status() MembershipStatus     { return MembershipStatus{} }
func (standalone) Close() error                 { return nil }
