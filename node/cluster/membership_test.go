package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/cluster"
)

// testDeadAfter is the tests' DeadAfter: memberlist probes every 100ms.
const testDeadAfter = time.Second

// member is one in-process cluster member on a faultNet.
type member struct {
	*cluster.Membership
	end *faultEnd
}

// startMember starts a membership called name on its own end of fn,
// joining seeds. tweak, if not nil, adjusts the config first. It is shut
// down when the test ends.
func startMember(t *testing.T, fn *faultNet, name string, seeds []string, tweak func(*cluster.Config)) member {
	t.Helper()
	end := fn.newEnd()
	cfg := cluster.Config{
		NodeName:       name,
		Join:           seeds,
		DeadAfter:      testDeadAfter,
		RejoinInterval: 200 * time.Millisecond,
		Transport:      end,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	m, err := cluster.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Shutdown() })
	return member{m, end}
}

// startCluster starts members called a, b, c, ... each joining the first.
func startCluster(t *testing.T, fn *faultNet, k int, tweak func(*cluster.Config)) []member {
	t.Helper()
	ms := make([]member, k)
	for i := range k {
		var seeds []string
		if i > 0 {
			seeds = []string{ms[0].end.addr}
		}
		ms[i] = startMember(t, fn, string(rune('a'+i)), seeds, tweak)
	}
	return ms
}

// view is what a member sees: each member's name and state.
func view(m *cluster.Membership) map[string]string {
	v := map[string]string{}
	for _, mb := range m.Members() {
		v[mb.Name] = mb.State.String()
	}
	return v
}

func formatView(v map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(v)) {
		parts = append(parts, k+"="+v[k])
	}
	return strings.Join(parts, " ")
}

// waitFor polls cond until it holds or the deadline passes; then it fails
// the test with what cond last described.
func waitFor(t *testing.T, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, what := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitView waits until m sees exactly want (name → state) and counts
// size live members.
func waitView(t *testing.T, m member, want map[string]string, size int) {
	t.Helper()
	waitFor(t, 20*testDeadAfter, func() (bool, string) {
		got := view(m.Membership)
		return maps.Equal(got, want) && m.Size() == size,
			fmt.Sprintf("%s sees [%s] size %d; want [%s] size %d", m.Name(), formatView(got), m.Size(), formatView(want), size)
	})
}

func TestMembershipJoin(t *testing.T) {
	ms := startCluster(t, newFaultNet(), 3, nil)
	all := map[string]string{"a": "alive", "b": "alive", "c": "alive"}
	for _, m := range ms {
		waitView(t, m, all, 3)
	}
	for _, mb := range ms[1].Members() {
		if mb.Self != (mb.Name == "b") {
			t.Errorf("b's view marks %s self=%v", mb.Name, mb.Self)
		}
		if mb.Addr == "" || mb.Since.IsZero() {
			t.Errorf("b's view of %s lacks an address or a time: %+v", mb.Name, mb)
		}
	}
}

// A seed that is a DNS name joins every address it resolves to, as a
// Kubernetes headless service names every pod.
func TestMembershipJoinsEveryAddressOfADNSName(t *testing.T) {
	fn := newFaultNet()
	// a and b do not know each other; c's one seed resolves to both.
	a := startMember(t, fn, "a", nil, nil)
	b := startMember(t, fn, "b", nil, nil)
	lookups := make(chan string, 100)
	c := startMember(t, fn, "c", []string{"quotad-headless.test"}, func(cfg *cluster.Config) {
		cfg.LookupHost = func(_ context.Context, host string) ([]string, error) {
			lookups <- host
			if host != "quotad-headless.test" {
				return nil, errors.New("no such host")
			}
			return []string{a.end.ip.String(), b.end.ip.String()}, nil
		}
	})
	all := map[string]string{"a": "alive", "b": "alive", "c": "alive"}
	for _, m := range []member{a, b, c} {
		waitView(t, m, all, 3)
	}
	if host := <-lookups; host != "quotad-headless.test" {
		t.Fatalf("looked up %q", host)
	}
}

func TestMembershipGracefulLeave(t *testing.T) {
	ms := startCluster(t, newFaultNet(), 3, nil)
	all := map[string]string{"a": "alive", "b": "alive", "c": "alive"}
	for _, m := range ms {
		waitView(t, m, all, 3)
	}
	if err := ms[2].Close(); err != nil {
		t.Fatal(err)
	}
	after := map[string]string{"a": "alive", "b": "alive", "c": "left"}
	waitView(t, ms[0], after, 2)
	waitView(t, ms[1], after, 2)
}

// A member that stops answering, on a network that loses a fifth of its
// packets, is declared dead by both others; they still see each other.
func TestMembershipDetectsACrash(t *testing.T) {
	fn := newFaultNet()
	ms := startCluster(t, fn, 3, nil)
	all := map[string]string{"a": "alive", "b": "alive", "c": "alive"}
	for _, m := range ms {
		waitView(t, m, all, 3)
	}
	fn.setLoss(20)
	crashed := time.Now()
	ms[2].end.crash()
	ms[2].Shutdown()
	after := map[string]string{"a": "alive", "b": "alive", "c": "dead"}
	waitView(t, ms[0], after, 2)
	waitView(t, ms[1], after, 2)
	t.Logf("crash detected by both survivors after %s (DeadAfter %s, 20%% packet loss)", time.Since(crashed).Round(time.Millisecond), testDeadAfter)
}

// A partition splits the cluster into two views; once it heals the rejoin
// loop merges them again (memberlist alone would not: it never contacts a
// dead member again).
func TestMembershipPartitionHeals(t *testing.T) {
	fn := newFaultNet()
	ms := startCluster(t, fn, 3, nil)
	a, b, c := ms[0], ms[1], ms[2]
	all := map[string]string{"a": "alive", "b": "alive", "c": "alive"}
	for _, m := range ms {
		waitView(t, m, all, 3)
	}
	fn.partition([]*faultEnd{a.end}, []*faultEnd{b.end, c.end})
	waitView(t, a, map[string]string{"a": "alive", "b": "dead", "c": "dead"}, 1)
	bc := map[string]string{"a": "dead", "b": "alive", "c": "alive"}
	waitView(t, b, bc, 2)
	waitView(t, c, bc, 2)

	contacts := a.Stats().JoinContacts + b.Stats().JoinContacts + c.Stats().JoinContacts
	fn.heal()
	for _, m := range ms {
		waitView(t, m, all, 3)
	}
	if after := a.Stats().JoinContacts + b.Stats().JoinContacts + c.Stats().JoinContacts; after <= contacts {
		t.Fatalf("the views merged without a rejoin (join contacts %d before the heal, %d after)", contacts, after)
	}
}

// A node with another gossip key, or none, cannot join; the others do not
// count it.
func TestMembershipRefusesAWrongKey(t *testing.T) {
	fn := newFaultNet()
	key := []byte("0123456789abcdef0123456789abcdef")
	withKey := func(k []byte) func(*cluster.Config) {
		return func(c *cluster.Config) { c.SecretKey = k }
	}
	ms := startCluster(t, fn, 2, withKey(key))
	two := map[string]string{"a": "alive", "b": "alive"}
	waitView(t, ms[0], two, 2)
	waitView(t, ms[1], two, 2)

	for name, k := range map[string][]byte{"wrong": []byte("fedcba9876543210fedcba9876543210"), "none": nil} {
		intruder := startMember(t, fn, name, nil, withKey(k))
		n, err := intruder.Join(context.Background(), ms[0].end.addr)
		if err == nil {
			t.Fatalf("a node with key %q joined (%d contacts)", name, n)
		}
		if intruder.Size() != 1 || ms[0].Size() != 2 || ms[1].Size() != 2 {
			t.Fatalf("after a refused join with key %q: sizes %d (intruder), %d, %d", name, intruder.Size(), ms[0].Size(), ms[1].Size())
		}
		if v := view(ms[0].Membership); !maps.Equal(v, two) {
			t.Fatalf("a sees [%s] after a refused join", formatView(v))
		}
	}
}

func TestMembershipConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		cfg  cluster.Config
		want string
	}{
		{"no address", cluster.Config{}, "bind address"},
		{"bind to a name", cluster.Config{BindAddr: "localhost:7946"}, "not an IP"},
		{"bind without port", cluster.Config{BindAddr: "127.0.0.1"}, "host:port"},
		{"bad port", cluster.Config{BindAddr: "127.0.0.1:99999"}, "port"},
		{"advertise without host", cluster.Config{BindAddr: ":7946", AdvertiseAddr: ":7946"}, "advertise"},
		{"bad seed", cluster.Config{BindAddr: ":7946", Join: []string{"a:b:c"}}, "join[0]"},
		{"short key", cluster.Config{BindAddr: ":7946", SecretKey: []byte("short")}, "16, 24 or 32"},
		{"tiny dead after", cluster.Config{BindAddr: ":7946", DeadAfter: time.Millisecond}, "dead after"},
		{"negative rejoin", cluster.Config{BindAddr: ":7946", RejoinInterval: -time.Second}, "rejoin interval"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := cluster.New(tc.cfg, nil)
			if err == nil {
				m.Shutdown()
				t.Fatal("accepted")
			}
			if !errors.Is(err, node.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q; want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}
