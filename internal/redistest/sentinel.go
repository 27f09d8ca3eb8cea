package redistest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"
)

// MasterName is the name the Sentinel monitors its master under.
const MasterName = "mymaster"

// DownAfter is how long the master may be unreachable before the Sentinel
// counts it as down and fails over.
const DownAfter = time.Second

// sentinelTimeout bounds every wait for the Sentinel to notice something.
const sentinelTimeout = 30 * time.Second

// Sentinel is a master, its replica and one Sentinel monitoring them
// (quorum 1), owned by a test. The two data servers swap roles on every
// failover; Master and Replica ask the Sentinel which is which.
//
// Its methods fail the test on error and must be called from the test's
// goroutine.
type Sentinel struct {
	t        testing.TB
	data     [2]*Server
	sentinel *Server
}

// StartSentinel starts a master, a replica of it and a Sentinel, and waits
// until the replica has synced and the Sentinel knows both. opts apply to
// the two data servers.
//
// The Sentinel runs with short periods (SENTINEL DEBUG): it polls every
// instance's INFO every 100ms and converts a returning old master to a
// replica within a second, and never enters TILT mode (which a loaded test
// machine could trigger, and which would block failover for 30s).
func StartSentinel(t testing.TB, opts ...Option) *Sentinel {
	t.Helper()
	// Either server may become master: both start full syncs at once
	// rather than after the default 5s wait for more replicas.
	opts = append([]Option{WithArgs("--repl-diskless-sync-delay", "0")}, opts...)
	master := Start(t, opts...)
	replica := Start(t, append(slices.Clip(opts), WithArgs("--replicaof", "127.0.0.1", strconv.Itoa(master.Port())))...)
	waitFor(t, "replica synced", sentinelTimeout, func() error { return replicating(replica) })
	conf := fmt.Sprintf(`sentinel monitor %[1]s 127.0.0.1 %[2]d 1
sentinel down-after-milliseconds %[1]s %[3]d
sentinel failover-timeout %[1]s 5000
`, MasterName, master.Port(), DownAfter.Milliseconds())
	sen := Start(t, withConfigFile("sentinel.conf", conf), WithArgs("--sentinel"))
	if _, err := sen.Do("SENTINEL", "DEBUG",
		"info-period", "100",
		"ping-period", "200",
		"publish-period", "200",
		"tilt-trigger", "3600000",
	); err != nil {
		t.Fatalf("redistest: SENTINEL DEBUG: %v", err)
	}
	s := &Sentinel{t: t, data: [2]*Server{master, replica}, sentinel: sen}
	waitFor(t, "sentinel knows master and replica", sentinelTimeout, func() error { return s.knows(master, replica) })
	return s
}

// replicating reports whether r is a replica whose link to its master is up.
func replicating(r *Server) error {
	status, err := r.Info("INFO replication", "master_link_status")
	if err != nil {
		return err
	}
	if status != "up" {
		return fmt.Errorf("%s: master_link_status %q", r.Addr(), status)
	}
	return nil
}

// knows reports whether the Sentinel names master as the master and lists
// replica as a healthy replica of it.
func (s *Sentinel) knows(master, replica *Server) error {
	addr, err := s.masterAddr()
	if err != nil {
		return err
	}
	if addr != master.Addr() {
		return fmt.Errorf("sentinel names %s as master, want %s", addr, master.Addr())
	}
	reply, err := do(s.sentinel.Addr(), "SENTINEL", "REPLICAS", MasterName)
	if err != nil {
		return err
	}
	replicas, _ := reply.([]any)
	for _, r := range replicas {
		f := fields(r)
		if f["ip"]+":"+f["port"] != replica.Addr() {
			continue
		}
		if f["flags"] != "slave" || f["master-link-status"] != "ok" {
			return fmt.Errorf("sentinel sees replica %s with flags %q, link %q", replica.Addr(), f["flags"], f["master-link-status"])
		}
		return nil
	}
	return fmt.Errorf("sentinel does not list replica %s yet", replica.Addr())
}

// fields turns a flat [name, value, ...] array reply into a map.
func fields(reply any) map[string]string {
	elems, _ := reply.([]any)
	m := make(map[string]string, len(elems)/2)
	for i := 0; i+1 < len(elems); i += 2 {
		k, _ := elems[i].(string)
		v, _ := elems[i+1].(string)
		m[k] = v
	}
	return m
}

// masterAddr is the master's address as the Sentinel reports it.
func (s *Sentinel) masterAddr() (string, error) {
	hostPort, err := s.sentinel.DoList("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterName)
	if err != nil {
		return "", err
	}
	if len(hostPort) != 2 {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME answered %q", hostPort)
	}
	return hostPort[0] + ":" + hostPort[1], nil
}

// SentinelAddrs are the Sentinels' "127.0.0.1:PORT" addresses (one).
func (s *Sentinel) SentinelAddrs() []string { return []string{s.sentinel.Addr()} }

// MasterName is the name the Sentinel monitors the master under.
func (s *Sentinel) MasterName() string { return MasterName }

// Sentinel is the Sentinel process itself.
func (s *Sentinel) Sentinel() *Server { return s.sentinel }

// Master is the data server the Sentinel currently names as master.
func (s *Sentinel) Master() *Server {
	s.t.Helper()
	addr, err := s.masterAddr()
	if err != nil {
		s.t.Fatalf("redistest: sentinel: %v", err)
	}
	for _, d := range s.data {
		if d.Addr() == addr {
			return d
		}
	}
	s.t.Fatalf("redistest: sentinel names %s as master, which is neither data server", addr)
	return nil
}

// Replica is the data server that is not the master.
func (s *Sentinel) Replica() *Server {
	s.t.Helper()
	if m := s.Master(); m == s.data[0] {
		return s.data[1]
	}
	return s.data[0]
}

// WaitReplicated waits until the replica has applied every write the master
// had applied when it was called (its replication offset has reached the
// master's).
func (s *Sentinel) WaitReplicated() {
	s.t.Helper()
	master, replica := s.Master(), s.Replica()
	want, err := offset(master)
	if err != nil {
		s.t.Fatalf("redistest: master: %v", err)
	}
	waitFor(s.t, "replica caught up", sentinelTimeout, func() error {
		got, err := offset(replica)
		if err != nil {
			return err
		}
		if got < want {
			return fmt.Errorf("replica at offset %d, master was at %d", got, want)
		}
		return nil
	})
}

// offset is srv's replication offset: on a master, how far it has written
// its stream; on a replica, how far it has applied it.
func offset(srv *Server) (int64, error) {
	v, err := srv.Info("INFO replication", "master_repl_offset")
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// Failover makes the Sentinel promote the replica (SENTINEL FAILOVER, which
// does not wait for the replica to catch up: call WaitReplicated first if
// the test needs every write to survive), then waits until the Sentinel names it as master,
// it acts as one, and the old master has become its replica. It returns the
// new master.
func (s *Sentinel) Failover() *Server {
	s.t.Helper()
	old, next := s.Master(), s.Replica()
	waitFor(s.t, "SENTINEL FAILOVER accepted", sentinelTimeout, func() error {
		// NOGOODSLAVE until the Sentinel has fresh INFO from the replica.
		_, err := s.sentinel.Do("SENTINEL", "FAILOVER", MasterName)
		return err
	})
	s.WaitPromoted(next)
	waitFor(s.t, "old master replicates the new one", sentinelTimeout, func() error {
		if err := replicating(old); err != nil {
			return err
		}
		return s.knows(next, old)
	})
	return next
}

// WaitPromoted waits until the Sentinel names srv as master and srv reports
// role:master: after Failover, or after the test killed the master and the
// Sentinel noticed (DownAfter) and promoted the replica.
func (s *Sentinel) WaitPromoted(srv *Server) {
	s.t.Helper()
	waitFor(s.t, "promotion of "+srv.Addr(), sentinelTimeout, func() error {
		addr, err := s.masterAddr()
		if err != nil {
			return err
		}
		if addr != srv.Addr() {
			return fmt.Errorf("sentinel names %s as master", addr)
		}
		role, err := srv.Info("INFO replication", "role")
		if err != nil {
			return err
		}
		if role != "master" {
			return errors.New(srv.Addr() + " reports role " + role)
		}
		return nil
	})
}
