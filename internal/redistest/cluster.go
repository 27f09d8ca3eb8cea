package redistest

import (
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// NodeTimeout is the cluster-node-timeout cluster nodes run with: how long
// a master may be unreachable before the others count it as failed.
const NodeTimeout = time.Second

// clusterTimeout bounds every wait for the cluster to settle. A master
// rejoining after a restart takes about 2×NodeTimeout for the others to
// clear its failure plus Redis's own 2s delay before it serves again.
const clusterTimeout = 30 * time.Second

// Cluster is a Redis Cluster of masters without replicas, each a Server
// owned by the test, formed with `redis-cli --cluster create`. A killed
// master's slots are unavailable until it is restarted (there is no replica
// to promote), and while any slot is unserved the whole cluster answers
// CLUSTERDOWN (cluster-require-full-coverage is left at its default).
//
// Its methods fail the test on error and must be called from the test's
// goroutine; the Servers' Kill may be called from any goroutine.
type Cluster struct {
	t       testing.TB
	masters []*Server
	ids     []string // node IDs by master index; nodes.conf keeps them across restarts
}

// StartCluster starts masters (1, or at least 3) redis-server processes
// in cluster mode on free ports, joins them into one cluster with the
// 16384 slots split evenly and waits until every node reports
// cluster_state:ok and sees the same slot map. opts apply to every node
// (WithDurableWrites makes a master's counters survive Kill and Restart).
// One master serves every slot itself (redis-cli --cluster create wants
// three): the smallest Redis Cluster, for comparing with more.
func StartCluster(t testing.TB, masters int, opts ...Option) *Cluster {
	t.Helper()
	if masters != 1 && masters < 3 {
		t.Fatalf("redistest: a Redis Cluster needs 1 or at least 3 masters, not %d", masters)
	}
	cli := lookPath(t, "redis-cli") // shipped with redis-server
	c := &Cluster{t: t}
	for range masters {
		nodeOpts := append([]Option{
			func(s *Server) { s.cluster = true },
			WithArgs("--cluster-node-timeout", strconv.FormatInt(NodeTimeout.Milliseconds(), 10)),
		}, opts...)
		c.masters = append(c.masters, Start(t, nodeOpts...))
	}
	if masters == 1 {
		if _, err := c.masters[0].Do("CLUSTER", "ADDSLOTSRANGE", "0", "16383"); err != nil {
			t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE: %v", err)
		}
	} else {
		args := append([]string{"--cluster", "create"}, c.Addrs()...)
		args = append(args, "--cluster-replicas", "0", "--cluster-yes")
		if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
			t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
		}
	}
	for i, m := range c.masters {
		id, err := m.Do("CLUSTER", "MYID")
		if err != nil {
			t.Fatalf("redistest: master %d: CLUSTER MYID: %v", i, err)
		}
		c.ids = append(c.ids, id)
	}
	c.WaitOK()
	return c
}

// Addrs are the masters' "127.0.0.1:PORT" addresses, in master order: the
// seed addresses a cluster client takes.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.masters))
	for i, m := range c.masters {
		addrs[i] = m.Addr()
	}
	return addrs
}

// Len is the number of masters.
func (c *Cluster) Len() int { return len(c.masters) }

// Master returns master i (0 ≤ i < Len), to Do commands on, Kill or
// Restart it. A restarted master keeps its node ID and slots.
func (c *Cluster) Master(i int) *Server { return c.masters[i] }

// WaitOK waits until every master answers, reports cluster_state:ok and
// sees the same slot map with no slot mid-migration: after StartCluster,
// after a master's Restart, after a migration.
func (c *Cluster) WaitOK() {
	c.t.Helper()
	waitFor(c.t, "cluster ok", clusterTimeout, c.settled)
}

func (c *Cluster) settled() error {
	var first string
	for i, m := range c.masters {
		state, err := m.Info("CLUSTER INFO", "cluster_state")
		if err != nil {
			return fmt.Errorf("master %d: %w", i, err)
		}
		if state != "ok" {
			return fmt.Errorf("master %d: cluster_state %q", i, state)
		}
		nodes, err := m.Do("CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("master %d: %w", i, err)
		}
		view, err := slotMap(nodes)
		if err != nil {
			return fmt.Errorf("master %d: %w", i, err)
		}
		if i == 0 {
			first = view
		} else if view != first {
			return fmt.Errorf("master %d sees slots\n%s\nmaster 0 sees\n%s", i, view, first)
		}
	}
	return nil
}

// nodeLine is one line of CLUSTER NODES.
type nodeLine struct {
	id     string
	myself bool
	// slots are the slot ranges the node serves ("0-5460", "7000");
	// migrating and importing marks ("[7000->-id]") are in marks.
	slots, marks []string
}

// parseNodes parses a CLUSTER NODES reply.
func parseNodes(reply string) ([]nodeLine, error) {
	var out []nodeLine
	for line := range strings.Lines(reply) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q: too few fields", line)
		}
		n := nodeLine{id: f[0], myself: slices.Contains(strings.Split(f[2], ","), "myself")}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				n.marks = append(n.marks, s)
			} else {
				n.slots = append(n.slots, s)
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// slotMap is a node's view of who serves which slots, comparable between
// nodes. A slot mid-migration (a mark on the node's own line) is an error:
// the map is not settled.
func slotMap(reply string) (string, error) {
	nodes, err := parseNodes(reply)
	if err != nil {
		return "", err
	}
	var lines []string
	for _, n := range nodes {
		if n.myself && len(n.marks) > 0 {
			return "", fmt.Errorf("slots mid-migration: %v", n.marks)
		}
		if len(n.slots) > 0 {
			lines = append(lines, n.id+" "+strings.Join(n.slots, " "))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n"), nil
}

// serves reports whether slot is in one of ranges ("0-5460", "7000").
func serves(ranges []string, slot int) bool {
	for _, r := range ranges {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		l, err1 := strconv.Atoi(lo)
		h, err2 := strconv.Atoi(hi)
		if err1 == nil && err2 == nil && l <= slot && slot <= h {
			return true
		}
	}
	return false
}

// Slot returns key's hash slot, as the cluster computes it (CLUSTER
// KEYSLOT, asked of the first master that answers).
func (c *Cluster) Slot(key string) int {
	c.t.Helper()
	var err error
	for _, m := range c.masters {
		var reply string
		if reply, err = m.Do("CLUSTER", "KEYSLOT", key); err == nil {
			slot, err := strconv.Atoi(reply)
			if err != nil {
				c.t.Fatalf("redistest: CLUSTER KEYSLOT %q: %v", key, err)
			}
			return slot
		}
	}
	c.t.Fatalf("redistest: CLUSTER KEYSLOT %q: no master answers: %v", key, err)
	return 0
}

// Owner returns the index of the master that serves slot, by the masters'
// own account of their slots (so it is right as soon as a migration ends).
// Only masters that answer are asked.
func (c *Cluster) Owner(slot int) int {
	c.t.Helper()
	for i, m := range c.masters {
		reply, err := m.Do("CLUSTER", "NODES")
		if err != nil {
			continue
		}
		nodes, err := parseNodes(reply)
		if err != nil {
			c.t.Fatalf("redistest: master %d: %v", i, err)
		}
		for _, n := range nodes {
			if n.myself && serves(n.slots, slot) {
				return i
			}
		}
	}
	c.t.Fatalf("redistest: no answering master serves slot %d", slot)
	return 0
}

// KeysInSlot returns how many keys master i holds in slot.
func (c *Cluster) KeysInSlot(i, slot int) int {
	c.t.Helper()
	reply, err := c.masters[i].Do("CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot))
	if err != nil {
		c.t.Fatalf("redistest: master %d: CLUSTER COUNTKEYSINSLOT %d: %v", i, slot, err)
	}
	n, err := strconv.Atoi(reply)
	if err != nil {
		c.t.Fatalf("redistest: master %d: CLUSTER COUNTKEYSINSLOT %d: %v", i, slot, err)
	}
	return n
}

// MigrateSlot moves slot, with its keys, from the master serving it to
// master to, live: StartMigration, MoveKeys until none are left, Finish.
func (c *Cluster) MigrateSlot(slot, to int) {
	c.t.Helper()
	m := c.StartMigration(slot, to)
	for m.MoveKeys(100) > 0 {
	}
	m.Finish()
}

// Migration is one slot on its way from one master to another, moved the
// way redis-cli --cluster reshard moves it, one step at a time so that a
// test can run checks between the steps: while it lasts, the source serves
// the keys it still holds and redirects the others (ASK) to the target.
type Migration struct {
	c              *Cluster
	slot, from, to int
}

// StartMigration marks slot as importing on master to and migrating on the
// master that serves it now.
func (c *Cluster) StartMigration(slot, to int) *Migration {
	c.t.Helper()
	from := c.Owner(slot)
	if from == to {
		c.t.Fatalf("redistest: slot %d is already on master %d", slot, to)
	}
	m := &Migration{c: c, slot: slot, from: from, to: to}
	s := strconv.Itoa(slot)
	// Importing first: a client sent to the target by the source's ASK
	// must find it ready.
	m.setSlot(to, "CLUSTER", "SETSLOT", s, "IMPORTING", c.ids[from])
	m.setSlot(from, "CLUSTER", "SETSLOT", s, "MIGRATING", c.ids[to])
	return m
}

func (m *Migration) setSlot(i int, args ...string) {
	m.c.t.Helper()
	if _, err := m.c.masters[i].Do(args...); err != nil {
		m.c.t.Fatalf("redistest: master %d: %s: %v", i, strings.Join(args, " "), err)
	}
}

// From is the source's master index.
func (m *Migration) From() int { return m.from }

// To is the target's master index.
func (m *Migration) To() int { return m.to }

// MoveKeys moves up to n of the slot's keys still on the source to the
// target (MIGRATE, without REPLACE: a key on both sides would be a bug to
// report, not to paper over) and returns how many it moved; 0 means none
// are left.
func (m *Migration) MoveKeys(n int) int {
	m.c.t.Helper()
	src, dst := m.c.masters[m.from], m.c.masters[m.to]
	keys, err := src.DoList("CLUSTER", "GETKEYSINSLOT", strconv.Itoa(m.slot), strconv.Itoa(n))
	if err != nil {
		m.c.t.Fatalf("redistest: master %d: CLUSTER GETKEYSINSLOT %d: %v", m.from, m.slot, err)
	}
	if len(keys) == 0 {
		return 0
	}
	args := append([]string{"MIGRATE", "127.0.0.1", strconv.Itoa(dst.Port()), "", "0", "5000", "KEYS"}, keys...)
	if _, err := src.Do(args...); err != nil {
		m.c.t.Fatalf("redistest: master %d: MIGRATE %d keys of slot %d to master %d: %v", m.from, len(keys), m.slot, m.to, err)
	}
	return len(keys)
}

// Finish assigns the slot to the target on the target, the source and
// every other master (as redis-cli does, so that no node waits for gossip),
// then waits until the cluster has settled with the target serving it. Every
// key must have been moved (MoveKeys returned 0).
func (m *Migration) Finish() {
	m.c.t.Helper()
	s := strconv.Itoa(m.slot)
	order := []int{m.to, m.from}
	for i := range m.c.masters {
		if i != m.to && i != m.from {
			order = append(order, i)
		}
	}
	for _, i := range order {
		m.setSlot(i, "CLUSTER", "SETSLOT", s, "NODE", m.c.ids[m.to])
	}
	m.c.WaitOK()
	if owner := m.c.Owner(m.slot); owner != m.to {
		m.c.t.Fatalf("redistest: slot %d migrated to master %d but master %d serves it", m.slot, m.to, owner)
	}
}
