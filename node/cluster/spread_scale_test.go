package cluster_test

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/cluster"
)

// scaleEnv, set to a number of members, adds a cluster of that size (100
// in docs/cluster.md's table) to the sizes TestDenialSpreadScales runs.
// Without it the test runs 10 and 30 members, a few seconds of CPU.
const scaleEnv = "QUOTAD_GOSSIP_SCALE"

// scaleDeadAfter is the large clusters' DeadAfter; their gossip interval,
// the time between a spread packet's rounds, is a tenth of it.
const scaleDeadAfter = 2 * time.Second

// meteredWire is memberlist's UDP and TCP transport on 127.0.0.1 with two
// additions: it counts the gossip packets its member sends (memberlist
// user messages; quotad sends no others), and it loses what its member
// sends to an address cut off from it, and fails dials there, as a
// partition of the network would.
type meteredWire struct {
	*memberlist.NetTransport
	self       string
	cuts       *cutSet
	gossipSent atomic.Int64
}

// memberlist's message types (net.go): a user message, and the CRC
// header it puts in front of a packet to a peer that speaks protocol 5.
const (
	userMsg   = 8
	hasCRCMsg = 12
)

func (w *meteredWire) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if w.cuts.cut(w.self, a.Addr) {
		return time.Now(), nil // lost, as UDP loses it
	}
	msg := b
	if len(msg) > 5 && msg[0] == hasCRCMsg {
		msg = msg[5:]
	}
	if len(msg) > 0 && msg[0] == userMsg {
		w.gossipSent.Add(1)
	}
	return w.NetTransport.WriteToAddress(b, a)
}

func (w *meteredWire) WriteTo(b []byte, addr string) (time.Time, error) {
	return w.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (w *meteredWire) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if w.cuts.cut(w.self, a.Addr) {
		return nil, fmt.Errorf("dial %s: no route to host", a.Addr)
	}
	return w.NetTransport.DialAddressTimeout(a, timeout)
}

func (w *meteredWire) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return w.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// cutSet is the links a partition has cut, both ways.
type cutSet struct {
	mu    sync.Mutex
	pairs map[[2]string]bool
}

func (c *cutSet) cut(from, to string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pairs[[2]string{from, to}]
}

// partition cuts every link between a and b.
func (c *cutSet) partition(a, b []*scaleMember) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			c.pairs[[2]string{x.Addr(), y.Addr()}] = true
			c.pairs[[2]string{y.Addr(), x.Addr()}] = true
		}
	}
}

func (c *cutSet) heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.pairs)
}

// arrivals is the receiving end of a member's gossip, in the node's place:
// it records when each denial's key first arrived.
type arrivals struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (a *arrivals) ApplyDenial(d node.Denial) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.at[d.Key]; !ok {
		a.at[d.Key] = d.At
	}
}

func (a *arrivals) ApplyReset(string, string) {}

func (a *arrivals) arrived(key string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[key]
	return t, ok
}

// scaleMember is one member of a large in-process cluster on loopback.
type scaleMember struct {
	*cluster.Membership
	wire *meteredWire
	got  *arrivals
}

// startScaleCluster starts n members on 127.0.0.1, each joining the
// first, and waits until every one sees all n.
func startScaleCluster(t *testing.T, n int, cuts *cutSet) []*scaleMember {
	t.Helper()
	ms := make([]*scaleMember, n)
	for i := range ms {
		var join []string
		if i > 0 {
			join = []string{ms[0].Addr()}
		}
		var wire *meteredWire
		m := startLoopbackMember(t, fmt.Sprintf("m%03d", i), join, func(c *cluster.Config) {
			// Probes every 200ms, each given 100ms: at 1s (50ms) a loaded
			// machine has members of a hundred declared dead for a moment,
			// and a denial sent meanwhile rightly passes them by.
			c.DeadAfter = scaleDeadAfter
			// Rejoins after the partition contact every dead member's
			// address: once a second keeps that from piling up.
			c.RejoinInterval = time.Second
		}, func(tr *memberlist.NetTransport) memberlist.NodeAwareTransport {
			wire = &meteredWire{NetTransport: tr, self: "127.0.0.1:" + strconv.Itoa(tr.GetAutoBindPort()), cuts: cuts}
			return wire
		})
		got := &arrivals{at: map[string]time.Time{}}
		if err := m.Serve(got); err != nil {
			t.Fatal(err)
		}
		ms[i] = &scaleMember{Membership: m, wire: wire, got: got}
	}
	waitSizes(t, ms, n)
	return ms
}

// waitSizes waits until every member of ms counts want live members.
func waitSizes(t *testing.T, ms []*scaleMember, want int) {
	t.Helper()
	waitFor(t, 120*time.Second, func() (bool, string) {
		for _, m := range ms {
			if m.Size() != want {
				return false, fmt.Sprintf("%s sees %d members; want %d", m.Name(), m.Size(), want)
			}
		}
		return true, ""
	})
}

// announce has from announce a denial of key, as its node does after a
// store denies it.
func announce(from *scaleMember, key string) time.Time {
	at := time.Now()
	from.AnnounceDenial(node.Denial{
		Policy: "scale", Key: key, Limit: fiveAMinute, Cost: 1,
		RetryAfter: 30 * time.Second, ResetAfter: 30 * time.Second, At: at,
	})
	return at
}

// waitSpread waits until every member of to has the denial of key and
// every member of all has sent all it queued, and returns how long each
// of to took after sent.
func waitSpread(t *testing.T, all, to []*scaleMember, key string, sent time.Time) []time.Duration {
	t.Helper()
	var took []time.Duration
	waitFor(t, 60*time.Second, func() (bool, string) {
		took = took[:0]
		for _, m := range to {
			at, ok := m.got.arrived(key)
			if !ok {
				return false, fmt.Sprintf("%s has no denial of %s", m.Name(), key)
			}
			took = append(took, at.Sub(sent))
		}
		for _, m := range all {
			if q := m.Stats().Gossip.Queued; q > 0 {
				return false, fmt.Sprintf("%s still has %d broadcasts queued", m.Name(), q)
			}
		}
		return true, ""
	})
	return took
}

// spreadFigures are one mode's figures at one size.
type spreadFigures struct {
	p50, max time.Duration
	// meanSent is the packets a member sends per denial, on average;
	// mostS the most one member sent for one denial.
	meanSent, mostS float64
}

// measureSpread has denials members announce a denial each, in turn, and
// measures how long each takes to reach the others and how many gossip
// packets each member sends for it.
func measureSpread(t *testing.T, ms []*scaleMember, mode string, denials int) spreadFigures {
	t.Helper()
	var (
		took  []time.Duration
		total int64
		f     spreadFigures
	)
	for d := range denials {
		before := make([]int64, len(ms))
		for i, m := range ms {
			before[i] = m.wire.gossipSent.Load()
		}
		origin := ms[d*len(ms)/denials]
		key := fmt.Sprintf("%s-%d", mode, d)
		sent := announce(origin, key)
		others := slices.DeleteFunc(slices.Clone(ms), func(m *scaleMember) bool { return m == origin })
		took = append(took, waitSpread(t, ms, others, key, sent)...)
		waitQuiet(t, ms)
		for i, m := range ms {
			n := m.wire.gossipSent.Load() - before[i]
			total += n
			f.mostS = max(f.mostS, float64(n))
		}
	}
	f.meanSent = float64(total) / float64(len(ms)) / float64(denials)
	slices.Sort(took)
	f.p50, f.max = took[len(took)/2], took[len(took)-1]
	return f
}

// waitQuiet waits until no member of ms has sent a gossip packet for
// 100ms: the copies of a denial still on their way have arrived, and what
// their receivers relay has gone out, so that each denial's packets are
// counted as its own.
func waitQuiet(t *testing.T, ms []*scaleMember) {
	t.Helper()
	sum := func() (n int64) {
		for _, m := range ms {
			n += m.wire.gossipSent.Load()
		}
		return n
	}
	last, since := sum(), time.Now()
	waitFor(t, 60*time.Second, func() (bool, string) {
		if n := sum(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= 100*time.Millisecond, "the members keep sending gossip"
	})
}

// cpuTime is the CPU this process has used, user and system.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// A denial reaches every member of clusters of 10, 30 (and, with
// QUOTAD_GOSSIP_SCALE=100, 100) members on loopback UDP, while each member
// sends O(log n) packets per denial: at most the fan-out times the rounds,
// 3 × 2⌈log10(n+1)⌉, against 2(n-1) from the member that found it when
// every message goes to every member, which each cluster also measures as
// the control. The largest cluster is then split, keeps spreading within
// each side, heals, and spreads across all of it again.
func TestDenialSpreadScales(t *testing.T) {
	sizes := []int{10, 30}
	if v := os.Getenv(scaleEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("%s=%q: want a number of members, at least 2", scaleEnv, v)
		}
		sizes = append(sizes, n)
	}
	const denials = 5
	type row struct {
		n               int
		direct, spread  spreadFigures
		heapKiB, cpuPct float64
		formed          time.Duration
		bound           int
	}
	var rows []row
	for i, n := range sizes {
		cuts := &cutSet{pairs: map[[2]string]bool{}}
		heap0, start := heapInUse(), time.Now()
		ms := startScaleCluster(t, n, cuts)
		r := row{n: n, formed: time.Since(start), bound: cluster.SpreadSendsPerMessage(n)}
		if heap1 := heapInUse(); heap1 > heap0 {
			r.heapKiB = float64(heap1-heap0) / 1024 / float64(n)
		}
		// What a member costs at rest: memberlist's probes and state.
		cpu0, quiet0 := cpuTime(t), time.Now()
		time.Sleep(2 * time.Second)
		r.cpuPct = 100 * float64(cpuTime(t)-cpu0) / float64(time.Since(quiet0)) / float64(n)

		for _, m := range ms {
			cluster.SetGossipFanout(m.Membership, n) // every member, as before
		}
		r.direct = measureSpread(t, ms, "direct", denials)
		for _, m := range ms {
			cluster.SetGossipFanout(m.Membership, cluster.GossipFanout)
		}
		r.spread = measureSpread(t, ms, "spread", denials)
		rows = append(rows, r)

		if r.spread.mostS > float64(r.bound) {
			t.Errorf("%d members: a member sent %.1f packets per spread denial; the bound is %d (fan-out %d × %d rounds)",
				n, r.spread.mostS, r.bound, cluster.GossipFanout, r.bound/cluster.GossipFanout)
		}
		if r.direct.mostS != float64(2*(n-1)) { // the finder, to every other member twice
			t.Errorf("%d members: sending to every member, the finder sent %.1f packets per denial; want 2(n-1) = %d", n, r.direct.mostS, 2*(n-1))
		}
		if r.spread.mostS >= r.direct.mostS {
			t.Errorf("%d members: the busiest member sent %.1f packets per denial spreading, %.1f sending to every member", n, r.spread.mostS, r.direct.mostS)
		}
		if i == len(sizes)-1 {
			partitionAndHeal(t, ms, cuts)
		}
		for _, m := range ms {
			m.Shutdown()
		}
	}
	t.Logf("%s", "members | formed | heap/member | CPU/member at rest | every member: p50 / max, packets per member per denial (mean / busiest) | spread: p50 / max, packets (mean / busiest), bound")
	for _, r := range rows {
		t.Logf("%7d | %6s | %8.0f KiB | %6.2f%% of a core | %s / %s, %.1f / %.1f | %s / %s, %.1f / %.1f, %d",
			r.n, r.formed.Round(100*time.Millisecond), r.heapKiB, r.cpuPct,
			r.direct.p50.Round(10*time.Microsecond), r.direct.max.Round(10*time.Microsecond), r.direct.meanSent, r.direct.mostS,
			r.spread.p50.Round(10*time.Microsecond), r.spread.max.Round(10*time.Microsecond), r.spread.meanSent, r.spread.mostS, r.bound)
	}
	// Growth: from the smallest size to the largest the busiest member's
	// packets per denial grow as the rounds do, ⌈log10(n+1)⌉, while
	// sending to every member grows as n.
	first, last := rows[0], rows[len(rows)-1]
	if grow, rounds := last.spread.mostS/first.spread.mostS, float64(last.bound)/float64(first.bound); grow > rounds*1.01 {
		t.Errorf("packets per member per denial grew %.2f× from %d to %d members; the rounds grew %.2f×", grow, first.n, last.n, rounds)
	}
}

// partitionAndHeal cuts a tenth of ms off the rest, sees a denial spread
// within the larger side and not cross, heals, and sees a denial from the
// smaller side reach every member.
func partitionAndHeal(t *testing.T, ms []*scaleMember, cuts *cutSet) {
	t.Helper()
	small, large := ms[:max(1, len(ms)/10)], ms[max(1, len(ms)/10):]
	cut := time.Now()
	cuts.partition(small, large)
	waitSizes(t, small, len(small))
	waitSizes(t, large, len(large))
	t.Logf("partition of %d and %d members: both sides see only their own after %s", len(small), len(large), time.Since(cut).Round(100*time.Millisecond))

	sent := announce(large[0], "partitioned")
	waitSpread(t, ms, large[1:], "partitioned", sent)
	for _, m := range small {
		if _, ok := m.got.arrived("partitioned"); ok {
			t.Fatalf("%s, on the other side of the partition, has the denial", m.Name())
		}
	}

	healed := time.Now()
	cuts.heal()
	waitSizes(t, ms, len(ms))
	t.Logf("healed: all %d members see all after %s", len(ms), time.Since(healed).Round(100*time.Millisecond))
	sent = announce(small[0], "healed")
	took := waitSpread(t, ms, ms[1:], "healed", sent)
	t.Logf("after the heal a denial reached the other %d members within %s", len(took), slices.Max(took).Round(10*time.Microsecond))
}

// A cluster of at most fan-out + 1 members (3 and 4 here) keeps sending
// each denial to every member, in one hop: the finder sends 2(n-1)
// packets and nobody relays. The figures of relaying instead (at a
// fan-out below the peers, which a relay then completes: 1 at 3 members,
// 2 at 4; and at 5, the default fan-out against sending to every member)
// are measured in the same run and logged: they are why the line is drawn
// there.
func TestSmallClustersSendToEveryMember(t *testing.T) {
	const denials = 6
	for _, tc := range []struct {
		n, relayFanout int
	}{{3, 1}, {4, 2}, {5, cluster.GossipFanout}} {
		ms := startScaleCluster(t, tc.n, &cutSet{pairs: map[[2]string]bool{}})
		defaultPath := measureSpread(t, ms, "default", denials)
		for _, m := range ms {
			cluster.SetGossipFanout(m.Membership, tc.relayFanout)
		}
		relayed := measureSpread(t, ms, "relayed", denials)
		for _, m := range ms {
			cluster.SetGossipFanout(m.Membership, tc.n)
		}
		everyMember := measureSpread(t, ms, "every", denials)
		t.Logf("%d members: by default p50 %s max %s, %.1f packets per member per denial (busiest %.0f); relayed at fan-out %d: p50 %s max %s, %.1f (busiest %.0f); to every member: p50 %s max %s, %.1f (busiest %.0f)",
			tc.n, defaultPath.p50.Round(10*time.Microsecond), defaultPath.max.Round(10*time.Microsecond), defaultPath.meanSent, defaultPath.mostS,
			tc.relayFanout, relayed.p50.Round(10*time.Microsecond), relayed.max.Round(10*time.Microsecond), relayed.meanSent, relayed.mostS,
			everyMember.p50.Round(10*time.Microsecond), everyMember.max.Round(10*time.Microsecond), everyMember.meanSent, everyMember.mostS)
		if tc.n-1 <= cluster.GossipFanout {
			// Exactly the packets of sending to every member: the finder's
			// 2(n-1), nobody else's.
			if want := float64(2 * (tc.n - 1)); defaultPath.mostS != want || defaultPath.meanSent != want/float64(tc.n) {
				t.Errorf("%d members: by default the busiest member sent %.1f packets per denial, %.2f on average; want %.0f and %.2f, the finder's alone",
					tc.n, defaultPath.mostS, defaultPath.meanSent, want, want/float64(tc.n))
			}
		} else if bound := float64(cluster.SpreadSendsPerMessage(tc.n)); defaultPath.mostS > bound {
			t.Errorf("%d members: by default a member sent %.1f packets per denial; the bound is %.0f", tc.n, defaultPath.mostS, bound)
		}
		for _, m := range ms {
			m.Shutdown()
		}
	}
}
