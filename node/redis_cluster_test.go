package node_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/accuracy"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

func newClusterStore(t *testing.T, c *redistest.Cluster) *redis.Store {
	t.Helper()
	s, err := redis.New(context.Background(), redis.Config{ClusterAddrs: c.Addrs(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// keyBase is the Redis key base a node with the default prefix uses for
// policy and key. Tests that rely on it confirm it by finding the keys.
func keyBase(policy, key string) string { return "{quotad:" + policy + ":" + key + "}" }

// scriptSHAs are the SHA1 digests of every check and release script.
func scriptSHAs() []string {
	var shas []string
	for _, a := range algorithms.Algorithms() {
		for _, src := range []string{algorithms.CheckScript(a), algorithms.ReleaseScript(a)} {
			sum := sha1.Sum([]byte(src))
			shas = append(shas, hex.EncodeToString(sum[:]))
		}
	}
	return shas
}

// missingScripts returns how many of the scripts srv's script cache lacks.
func missingScripts(srv *redistest.Server) (int, error) {
	exists, err := srv.DoList(append([]string{"SCRIPT", "EXISTS"}, scriptSHAs()...)...)
	if err != nil {
		return 0, err
	}
	missing := 0
	for _, e := range exists {
		if e != "1" {
			missing++
		}
	}
	return missing, nil
}

// waitScripts waits until srv holds every script: a store reloads them in
// the background after meeting NOSCRIPT.
func waitScripts(t *testing.T, srv *redistest.Server) {
	t.Helper()
	waitUntil(t, 10*time.Second, "every script on "+srv.Addr(), func() bool {
		missing, err := missingScripts(srv)
		return err == nil && missing == 0
	})
}

// crc16Slot is Redis Cluster's hash slot of key (CRC16/XMODEM of its hash
// tag), computed locally so a test can search many keys for one slot.
func crc16Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// keyInSlot returns a key whose base under policy is in slot, confirmed by
// the cluster's own CLUSTER KEYSLOT.
func keyInSlot(t *testing.T, c *redistest.Cluster, policy string, slot int) string {
	t.Helper()
	for n := range 1 << 22 {
		key := "k" + strconv.Itoa(n)
		if crc16Slot(keyBase(policy, key)) == slot {
			if got := c.Slot(keyBase(policy, key)); got != slot {
				t.Fatalf("local slot %d, cluster says %d: the test's CRC16 is wrong", slot, got)
			}
			return key
		}
	}
	t.Fatalf("no key for policy %s in slot %d", policy, slot)
	return ""
}

// Every algorithm, with leases on and off, works through a 3-master
// cluster: exactly the limit allowed, then denied; every limit's keys share
// one slot on the master that owns it, and the limits spread over all the
// masters; every master holds every script from the start.
func TestRedisClusterAlgorithms(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	store := newClusterStore(t, c)
	for i := range c.Len() {
		if missing, err := missingScripts(c.Master(i)); err != nil || missing != 0 {
			t.Fatalf("master %d lacks %d scripts after redis.New (%v)", i, missing, err)
		}
	}
	ctx := context.Background()
	// A 365-day period: nothing refills or rolls over during the test, so
	// the count is exact. 400 is large enough to lease (the cap is 5%).
	const limit = 400
	var policies []node.Policy
	for _, a := range algorithms.Algorithms() {
		for _, mode := range []node.LeaseMode{node.LeaseAuto, node.LeaseOff} {
			policies = append(policies, node.Policy{
				Name:  fmt.Sprintf("%s-%s", a, mode),
				Limit: algorithms.Limit{Algorithm: a, Limit: limit, Period: algorithms.MaxPeriod},
				Lease: mode,
			})
		}
	}
	// Configured, so that their keys are the families keyBase names.
	n := newNode(t, store, node.Config{Policies: policies})
	mastersUsed := map[int]bool{}
	for i, a := range algorithms.Algorithms() {
		for j, mode := range []node.LeaseMode{node.LeaseAuto, node.LeaseOff} {
			p := policies[2*i+j]
			// Spread the limits over the masters on purpose: the slot of
			// the (2i+j)th limit is in master (2i+j) mod 3's range.
			master := (2*i + j) % c.Len()
			key := keyInSlot(t, c, p.Name, firstSlotOf(t, c, master))
			t.Run(p.Name, func(t *testing.T) {
				leasesBefore := n.Stats().LeasesGranted
				allowed := 0
				for {
					res, err := n.Check(ctx, p, key, 1)
					if err != nil || (res.Source != node.SourceStore && res.Source != node.SourceLease && res.Source != node.SourceDeniedCache) {
						t.Fatalf("check %d: %+v, %v", allowed+1, res, err)
					}
					if !res.Allowed {
						break
					}
					allowed++
					if allowed > limit {
						t.Fatalf("more than %d allowed", limit)
					}
				}
				if allowed != limit {
					t.Fatalf("%d allowed, want %d", allowed, limit)
				}
				if res, _ := n.Check(ctx, p, key, 1); res.Allowed {
					t.Fatalf("allowed after the denial: %+v", res)
				}
				leased := n.Stats().LeasesGranted > leasesBefore
				if leased != (mode == node.LeaseAuto) {
					t.Errorf("leases granted: %v, with lease mode %s", leased, mode)
				}

				// Every key of the limit's base is in one slot, served by
				// the master chosen above, which holds this algorithm's state.
				base := keyBase(p.Name, key)
				slot := c.Slot(base)
				for _, k := range algorithms.AllKeys(base) {
					if s := c.Slot(k); s != slot {
						t.Fatalf("%s is in slot %d, its base %s in %d", k, s, base, slot)
					}
				}
				owner := c.Owner(slot)
				if owner != master {
					t.Fatalf("slot %d is on master %d, want %d", slot, owner, master)
				}
				mastersUsed[owner] = true
				if got, err := c.Master(owner).HoldsState(algorithms.Keys(a, base)[0]); err != nil || !got {
					t.Fatalf("master %d: no state for %s (%v, %v): the state is not where the slot says", owner, algorithms.Keys(a, base)[0], got, err)
				}
			})
		}
	}
	if len(mastersUsed) != c.Len() {
		t.Fatalf("the limits used %d of %d masters", len(mastersUsed), c.Len())
	}

	// Keys that start with '}' used to share one slot,
	// the hash tag ending at the key's own brace ({quotad:p:}k1} hashes on
	// "quotad:p:"). The key's braces are escaped now, so the tag is the
	// whole key and such keys spread over every master.
	p := policies[1] // fixed window, no leases
	slots, owners := map[int]bool{}, map[int]bool{}
	oldSlots := map[int]bool{}
	const keys = 30
	for i := range keys {
		key := "}k" + strconv.Itoa(i)
		if res, err := n.Check(ctx, p, key, 1); err != nil || !res.Allowed {
			t.Fatalf("check %q: %+v, %v", key, res, err)
		}
		family := "{quotad:" + p.Name + ":%7Dk" + strconv.Itoa(i) + "}"
		slot := c.Slot(family)
		owner := c.Owner(slot)
		if got, err := c.Master(owner).HoldsState(algorithms.Keys(p.Limit.Algorithm, family)[0]); err != nil || !got {
			t.Fatalf("key %q: no state at %s on master %d (%v, %v)", key, family, owner, got, err)
		}
		slots[slot], owners[owner] = true, true
		oldSlots[c.Slot(keyBase(p.Name, key))] = true
	}
	t.Logf("%d keys starting with '}': %d slots on %d masters (the old layout: %d slot)", keys, len(slots), len(owners), len(oldSlots))
	if len(owners) != c.Len() || len(slots) < keys*9/10 {
		t.Fatalf("%d keys starting with '}' landed in %d slots on %d of %d masters", keys, len(slots), len(owners), c.Len())
	}

	// An inline limit's state is found on its slot's primary by Reset.
	inline := node.Policy{Name: "inline-ns", Limit: algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 2, Period: algorithms.MaxPeriod}, Lease: node.LeaseOff}
	if got := spend(t, n, inline, "}k", 2); got != 2 {
		t.Fatalf("inline limit: %d of 2", got)
	}
	if err := n.Reset(ctx, inline.Name, "}k"); err != nil {
		t.Fatal(err)
	}
	if res, err := n.Check(ctx, inline, "}k", 1); err != nil || !res.Allowed {
		t.Fatalf("inline limit after Reset: %+v, %v", res, err)
	}
}

// firstSlotOf returns the lowest slot master i serves.
func firstSlotOf(t *testing.T, c *redistest.Cluster, i int) int {
	t.Helper()
	for slot := 0; slot < 16384; slot += 64 {
		if c.Owner(slot) == i {
			return slot
		}
	}
	t.Fatalf("master %d serves no slot", i)
	return 0
}

// tally counts what concurrent checks got back.
type tally struct {
	mu      sync.Mutex
	allowed []accuracy.Admission // allowed by the store or a lease
	// answered counts answers from the store, a lease or the denied cache;
	// failed counts failure-mode answers.
	answered, failed atomic.Int64
	errs             atomic.Value
}

// drive sends checks of cost 1 for key from one goroutine per node until
// stop closes; the goroutines are counted in wg. Every answer must be a
// decision or the policy's (fail-closed) failure mode: never an error, never
// fail-open.
func drive(nodes []*node.Node, p node.Policy, key string, stop <-chan struct{}, tl *tally, wg *sync.WaitGroup) {
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []accuracy.Admission
			defer func() {
				tl.mu.Lock()
				tl.allowed = append(tl.allowed, mine...)
				tl.mu.Unlock()
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				before := time.Now()
				res, err := n.Check(context.Background(), p, key, 1)
				after := time.Now()
				switch {
				case err != nil || res.Source == node.SourceFailOpen:
					tl.errs.Store(fmt.Sprintf("%s: %+v, %v", p.Name, res, err))
					return
				case res.Source == node.SourceFailClosed:
					tl.failed.Add(1)
					if res.Allowed {
						tl.errs.Store(fmt.Sprintf("%s: fail-closed allowed: %+v", p.Name, res))
						return
					}
				default:
					tl.answered.Add(1)
					if res.Allowed {
						mine = append(mine, accuracy.Admission{Before: before, After: after})
					}
				}
				if !res.Allowed {
					// A client backing off, briefly: spinning on local
					// denials would starve the other limits' checks of CPU.
					time.Sleep(min(res.RetryAfter, 5*time.Millisecond))
				}
			}
		}()
	}
}

// hotLoad is two nodes hammering one fail-closed policy per algorithm and
// lease mode, each with a key in one slot, plus a long limit in that slot
// whose remaining units show whether its state survived: the load a
// migration or a restart runs under.
type hotLoad struct {
	c        *redistest.Cluster
	policies []node.Policy
	keys     []string
	tallies  []*tally
	start    time.Time
	stop     func()
	longKey  string
	longLeft int64
	nodes    []*node.Node
}

// Short periods and limits below the demand, so that the limits are
// reached, refilled and reached again many times during a run: 200 with
// leases, which still form (the cap is 5% of 200 across two nodes: 5
// units), and 10 without, where every check is a round trip.
const (
	hotPeriod      = 300 * time.Millisecond
	hotLimitLeased = 200
	hotLimitDirect = 10
)

// startHotLoad spends some of the long limit, then starts the load on
// slot; it stops when the test ends, if finish has not stopped it.
func startHotLoad(t *testing.T, c *redistest.Cluster, slot int) *hotLoad {
	t.Helper()
	h := &hotLoad{c: c}
	for _, a := range algorithms.Algorithms() {
		for _, mode := range []node.LeaseMode{node.LeaseAuto, node.LeaseOff} {
			p := node.Policy{
				Name:         fmt.Sprintf("hot-%s-%s", a, mode),
				Limit:        algorithms.Limit{Algorithm: a, Limit: hotLimitLeased, Period: hotPeriod},
				Lease:        mode,
				OnStoreError: node.FailClosed,
			}
			if mode == node.LeaseOff {
				p.Limit.Limit = hotLimitDirect
			}
			h.policies = append(h.policies, p)
			h.keys = append(h.keys, keyInSlot(t, c, p.Name, slot))
			h.tallies = append(h.tallies, &tally{})
		}
	}
	h.longKey = keyInSlot(t, c, longLimit.Name, slot)
	h.longLeft = spendLong(t, c, h.longKey, 7)
	var nodes []*node.Node
	for range 2 {
		nodes = append(nodes, newNode(t, newClusterStore(t, c), node.Config{Cluster: quotadtest.SizedCluster(2)}))
	}
	h.nodes = nodes
	done := make(chan struct{})
	var wg sync.WaitGroup
	h.start = time.Now()
	for i, p := range h.policies {
		drive(nodes, p, h.keys[i], done, h.tallies[i], &wg)
	}
	h.stop = sync.OnceFunc(func() {
		close(done)
		wg.Wait()
	})
	t.Cleanup(h.stop)
	return h
}

// longLimit neither refills nor rolls over during a test (1000 units a
// year): what remains of it shows whether a limit's state survived.
var longLimit = node.Policy{
	Name:         "long",
	Limit:        algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1000, Period: algorithms.MaxPeriod},
	Lease:        node.LeaseOff,
	OnStoreError: node.FailClosed,
}

// spendLong spends cost units of longLimit for key through a fresh node
// (no breaker state, no cache) and returns what remains at the authority.
func spendLong(t *testing.T, c *redistest.Cluster, key string, cost int64) int64 {
	t.Helper()
	n, err := node.New(node.Config{}, newClusterStore(t, c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	res, err := n.Check(context.Background(), longLimit, key, cost)
	if err != nil || res.Source != node.SourceStore || !res.Allowed {
		t.Fatalf("long limit: %+v, %v", res, err)
	}
	return res.Remaining
}

// answered and failed sum the tallies.
func (h *hotLoad) answered() (n int64) {
	for _, tl := range h.tallies {
		n += tl.answered.Load()
	}
	return n
}

func (h *hotLoad) failed() (n int64) {
	for _, tl := range h.tallies {
		n += tl.failed.Load()
	}
	return n
}

// progress waits until the limits have had n more decisions (not
// failures), failing t at once if a check went wrong.
func (h *hotLoad) progress(t *testing.T, n int64, what string) {
	t.Helper()
	from := h.answered()
	waitUntil(t, 20*time.Second, fmt.Sprintf("%d decisions %s", n, what), func() bool {
		for _, tl := range h.tallies {
			if e := tl.errs.Load(); e != nil {
				t.Fatalf("%s: %s", what, e)
			}
		}
		return h.answered() >= from+n
	})
}

// lasts lets the load run for d more, with decisions all along: long
// enough for whole windows to fall inside the run.
func (h *hotLoad) lasts(t *testing.T, d time.Duration) {
	t.Helper()
	until := time.Now().Add(d)
	for time.Now().Before(until) {
		h.progress(t, 10, "while the load runs on")
	}
}

// finish stops the load and fails t on any error, on any limit that
// allowed more than it permits over the run, and on a long limit whose
// remaining units changed across what happened (other than its own 7).
func (h *hotLoad) finish(t *testing.T, what string) {
	t.Helper()
	h.stop()
	run := time.Since(h.start)
	for i, p := range h.policies {
		tl := h.tallies[i]
		if e := tl.errs.Load(); e != nil {
			t.Errorf("%s", e)
			continue
		}
		sort.Slice(tl.allowed, func(a, b int) bool { return tl.allowed[a].Before.Before(tl.allowed[b].Before) })
		if len(tl.allowed) == 0 {
			t.Errorf("%s: nothing allowed", p.Name)
			continue
		}
		share := accuracy.NoOverAdmission(t, p.Limit.Algorithm, p.Limit.Limit, hotPeriod, h.start, run, tl.allowed)
		t.Logf("%s: %d decisions, %d failure-mode answers, %d allowed (%.0f%% of what the limit permits)",
			p.Name, tl.answered.Load(), tl.failed.Load(), len(tl.allowed), 100*share)
	}
	if got := spendLong(t, h.c, h.longKey, 0); got != h.longLeft {
		t.Errorf("the long limit had %d units left before %s, %d after", h.longLeft, what, got)
	}
}

// A slot holding every algorithm's hot limit moves to another master, key
// batch by key batch, while two nodes hammer those limits: every check gets
// a decision or its policy's failure mode, no limit allows more than it
// permits, and the target serves the limits afterwards with their state.
func TestRedisClusterMigrationUnderLoad(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	slot := firstSlotOf(t, c, 0)
	h := startHotLoad(t, c, slot)
	h.progress(t, 500, "before the migration")
	from := c.Owner(slot)
	m := c.StartMigration(slot, (from+1)%c.Len())
	h.progress(t, 300, "with the slot migrating, keys still on the source")
	batches := 0
	// Two keys at a time: a limit's keys (the sliding log has two) may be
	// split between the source and the target for a while.
	for m.MoveKeys(2) > 0 {
		batches++
		h.progress(t, 100, "between key batches")
	}
	if batches < 3 {
		t.Fatalf("the slot's keys moved in %d batches: the test did not exercise a partial migration", batches)
	}
	h.progress(t, 300, "with every key on the target, the slot still migrating")
	m.Finish()
	if c.KeysInSlot(m.To(), slot) == 0 {
		t.Fatal("no key of the hot limits on the target")
	}
	h.progress(t, 500, "after the migration")
	h.lasts(t, 2*hotPeriod)
	h.finish(t, "the migration")
	if c.KeysInSlot(m.From(), slot) != 0 {
		t.Fatalf("%d keys of slot %d left on the source", c.KeysInSlot(m.From(), slot), slot)
	}
	t.Logf("%d key batches; %d failure-mode answers in all", batches, h.failed())
}

// A master holding every algorithm's hot limit is killed and restarted (its
// writes fsynced, so it comes back with its counters) while two nodes
// hammer those limits: checks take the failure mode while it is down and
// get decisions again once it is back, no limit allows more than it
// permits, a limit's state survives, and the stores reload their scripts on
// the restarted master.
func TestRedisClusterMasterRestartUnderLoad(t *testing.T) {
	c := redistest.StartCluster(t, 3, redistest.WithDurableWrites())
	slot := firstSlotOf(t, c, 1)
	master := c.Master(c.Owner(slot))
	h := startHotLoad(t, c, slot)
	// Whole windows of decisions before the kill and after the restart.
	h.progress(t, 500, "before the kill")
	h.lasts(t, 3*hotPeriod)
	master.Kill()
	failedBefore := h.failed()
	waitUntil(t, 20*time.Second, "failure-mode answers while the master is down", func() bool { return h.failed() > failedBefore+100 })
	master.Restart()
	if missing, err := missingScripts(master); err != nil || missing == 0 {
		t.Fatalf("a restarted master still has its scripts (%d missing, %v): the reload would go untested", missing, err)
	}
	c.WaitOK()
	// The restarted master has a new run_id: each node drops its leases
	// and cached denials, within about a second.
	for i, n := range h.nodes {
		waitUntil(t, 10*time.Second, fmt.Sprintf("node %d to see the master's new run_id", i), func() bool { return n.Stats().StoreStateLosses >= 1 })
	}
	h.progress(t, 500, "after the restart")
	h.lasts(t, 3*hotPeriod)
	h.finish(t, "the restart")
	waitScripts(t, master)
	t.Logf("%d failure-mode answers in all", h.failed())
}
