package quotadclient_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// leaseHolderEnv tells TestLeaseHolderProcess, run as a subprocess, where
// to take leases: "<quotad URL> <policy>".
const leaseHolderEnv = "QUOTAD_TEST_LEASE_HOLDER"

// TestLeaseHolderProcess is not a test: TestKilledClientLosesOnlyItsLeases
// runs the test binary again with only this test and leaseHolderEnv set,
// as a client process in local mode that checks one key until it holds a
// lease, prints "allowed <n> held <units>", and then waits to be killed.
func TestLeaseHolderProcess(t *testing.T) {
	spec := os.Getenv(leaseHolderEnv)
	if spec == "" {
		t.Skip("a helper process of TestKilledClientLosesOnlyItsLeases")
	}
	url, policy, _ := strings.Cut(spec, " ")
	c, err := quotadclient.New(url, quotadclient.Options{Local: &quotadclient.LocalOptions{}})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	var allowed int64
	for i := 0; ; i++ {
		d, err := c.Check(context.Background(), policy, "k", 1)
		if err != nil || !d.Allowed {
			fmt.Println("error", d, err)
			os.Exit(1)
		}
		allowed++
		if i >= 2000 && d.Source == quotadclient.SourceClientLease {
			break
		}
	}
	fmt.Println("allowed", allowed, "held", c.LocalStats().UnitsHeld)
	select {}
}

// A client process killed while it holds a lease
// loses at most the lease's units, and never admits extra: Redis counts
// at least what it was allowed, and at most that plus what it held.
func TestKilledClientLosesOnlyItsLeases(t *testing.T) {
	r := redistest.Start(t)
	p := node.Policy{Name: "kill", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 100_000, Period: time.Hour}, OnStoreError: node.FailClosed}
	nodes := startLeaseNodes(t, r, 1, p)
	window := time.Now().Truncate(time.Hour)

	cmd := exec.Command(os.Args[0], "-test.run=^TestLeaseHolderProcess$")
	cmd.Env = append(os.Environ(), leaseHolderEnv+"="+nodes[0].url+" "+p.Name)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatalf("the holder process said nothing (%v)", lines.Err())
	}
	var allowed, held int64
	if _, err := fmt.Sscanf(lines.Text(), "allowed %d held %d", &allowed, &held); err != nil {
		t.Fatalf("the holder process said %q", lines.Text())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if held == 0 {
		t.Fatal("the holder held no lease when it was killed: the test proves nothing")
	}
	if time.Now().Truncate(time.Hour) != window {
		t.Skip("the hour turned during the test; its count is in two windows")
	}
	used, err := r.FixedWindowCount("{quotad:kill:k}:fw4")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the killed client was allowed %d and held %d leased units; Redis counts %d spent (%d lost)", allowed, held, used, used-allowed)
	if used < allowed {
		t.Errorf("Redis counts %d, fewer than the %d the client was allowed: others could admit extra", used, allowed)
	}
	if used > allowed+held {
		t.Errorf("Redis counts %d, more than the %d allowed plus the %d held", used, allowed, held)
	}
}
