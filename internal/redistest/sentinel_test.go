package redistest_test

import (
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/redistest"
)

// The replica follows the master; a failover swaps the roles, data intact;
// killing the master gets the replica promoted.
func TestSentinel(t *testing.T) {
	s := redistest.StartSentinel(t)
	if len(s.SentinelAddrs()) != 1 || s.MasterName() == "" {
		t.Fatalf("sentinels %v, master name %q", s.SentinelAddrs(), s.MasterName())
	}
	first, second := s.Master(), s.Replica()
	if first == second {
		t.Fatal("master and replica are the same server")
	}
	if _, err := first.Do("SET", "k", "1"); err != nil {
		t.Fatal(err)
	}
	s.WaitReplicated()
	if got, err := second.Do("GET", "k"); got != "1" {
		t.Fatalf("the replica has k=%q (%v)", got, err)
	}

	if got := s.Failover(); got != second {
		t.Fatalf("failover promoted %s, want the replica %s", got.Addr(), second.Addr())
	}
	if s.Master() != second || s.Replica() != first {
		t.Fatal("roles not swapped after failover")
	}
	if _, err := second.Do("INCR", "k"); err != nil {
		t.Fatalf("the new master refuses a write: %v", err)
	}
	if _, err := first.Do("SET", "k", "x"); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("the old master accepts writes: %v", err)
	}
	s.WaitReplicated()
	if got, _ := first.Do("GET", "k"); got != "2" {
		t.Fatalf("the old master, now a replica, has k=%q", got)
	}

	// The master dies: the Sentinel notices and promotes the replica.
	second.Kill()
	s.WaitPromoted(first)
	if got, err := first.Do("GET", "k"); err != nil || got != "2" {
		t.Fatalf("the promoted replica has k=%q, %v", got, err)
	}
}
