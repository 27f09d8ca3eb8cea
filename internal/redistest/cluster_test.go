package redistest_test

import (
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/redistest"
)

// The cluster forms with every master serving slots; a key is served only
// by its slot's owner; a migrated slot's keys move with it; a restarted
// master rejoins with its node ID, its slots and (with durable writes) its
// data.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3, redistest.WithDurableWrites())
	if got := len(c.Addrs()); got != 3 {
		t.Fatalf("%d addresses", got)
	}
	owners := map[int]bool{}
	for _, slot := range []int{0, 8191, 16383} {
		owners[c.Owner(slot)] = true
	}
	if len(owners) != 3 {
		t.Fatalf("slots 0, 8191 and 16383 are served by %d masters, want 3", len(owners))
	}

	// Keys sharing a hash tag share a slot; the owner serves it, the
	// others redirect.
	keys := []string{"{user:1}:a", "{user:1}:b", "{user:1}:c"}
	slot := c.Slot(keys[0])
	for _, k := range keys[1:] {
		if c.Slot(k) != slot {
			t.Fatalf("%s is in slot %d, %s in %d", k, c.Slot(k), keys[0], slot)
		}
	}
	from := c.Owner(slot)
	to := (from + 1) % c.Len()
	for _, k := range keys {
		if _, err := c.Master(from).Do("SET", k, "v-"+k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Master(to).Do("GET", keys[0]); err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
		t.Fatalf("a non-owner answered GET: %v", err)
	}

	// Migration, step by step.
	m := c.StartMigration(slot, to)
	if got, _ := c.Master(from).Do("GET", keys[0]); got != "v-"+keys[0] {
		t.Fatalf("mid-migration, the source no longer serves a key it holds: %q", got)
	}
	if n := m.MoveKeys(2); n != 2 {
		t.Fatalf("moved %d keys, want 2", n)
	}
	if n := m.MoveKeys(100); n != 1 {
		t.Fatalf("moved %d keys, want the last 1", n)
	}
	if n := m.MoveKeys(100); n != 0 {
		t.Fatalf("moved %d keys from an empty slot", n)
	}
	if _, err := c.Master(from).Do("GET", keys[0]); err == nil || !strings.HasPrefix(err.Error(), "ASK") {
		t.Fatalf("mid-migration, the source did not redirect a moved key: %v", err)
	}
	m.Finish()
	if c.Owner(slot) != to || c.KeysInSlot(to, slot) != 3 || c.KeysInSlot(from, slot) != 0 {
		t.Fatalf("after migration: owner %d, %d keys on target, %d on source",
			c.Owner(slot), c.KeysInSlot(to, slot), c.KeysInSlot(from, slot))
	}
	if got, err := c.Master(to).Do("GET", keys[2]); err != nil || got != "v-"+keys[2] {
		t.Fatalf("the target serves %q, %v", got, err)
	}
	if _, err := c.Master(from).Do("GET", keys[0]); err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
		t.Fatalf("after migration, the source answered GET: %v", err)
	}

	// Kill and restart the slot's new owner.
	id, _ := c.Master(to).Do("CLUSTER", "MYID")
	c.Master(to).Kill()
	if _, err := c.Master(to).Do("PING"); err == nil {
		t.Fatal("a killed master answers")
	}
	c.Master(to).Restart()
	c.WaitOK()
	if got, _ := c.Master(to).Do("CLUSTER", "MYID"); got != id {
		t.Fatalf("node ID %q after restart, was %q", got, id)
	}
	if c.Owner(slot) != to {
		t.Fatalf("after restart slot %d is on master %d, want %d", slot, c.Owner(slot), to)
	}
	if got, err := c.Master(to).Do("GET", keys[1]); err != nil || got != "v-"+keys[1] {
		t.Fatalf("after restart the master serves %q, %v", got, err)
	}
}
