package quotadclient_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// Concurrency limits shown end to end, on one real redis-server.

// fiveSlots is 5 slots living 2 s unless renewed. It fails closed: a
// check that fails open is admitted without a slot, outside the limit,
// which these tests do not want to count.
var fiveSlots = node.Policy{Name: "gpu", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 5, Period: 2 * time.Second}, OnStoreError: node.FailClosed}

// startSlotNode serves a real node on Redis r with policy p. Its Redis
// timeout is generous: on a loaded machine the tests' calls must not time
// out into the failure mode.
func startSlotNode(t *testing.T, r *redistest.Server, p node.Policy) string {
	t.Helper()
	store, err := redis.New(context.Background(), redis.Config{URL: r.URL(), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Policies: []node.Policy{p}}, store, nil)
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h, err := rpc.NewHandler(n, rpc.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return serveH2C(t, h)
}

// holding is one holder's slot as the holder saw it: from when quotad's
// answer granting it arrived to just before the release was sent. The
// authority held the slot over a longer interval, so if these never
// overlap more than the limit, neither did the authority's.
type holding struct {
	from, to time.Time
}

// maxOverlap is the most holdings in force at one instant. A holding that
// ends at the instant another starts is not counted with it.
func maxOverlap(hs []holding) int {
	type event struct {
		at    time.Time
		delta int
	}
	events := make([]event, 0, 2*len(hs))
	for _, h := range hs {
		events = append(events, event{h.from, +1}, event{h.to, -1})
	}
	slices.SortFunc(events, func(a, b event) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta // ends first
	})
	cur, most := 0, 0
	for _, e := range events {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}

// 50 holders through 3 quotad nodes on one Redis, each taking a slot of a
// 5-slot limit again and again, holding it a few milliseconds (renewing it
// now and then) and releasing it: never more than 5 held at any instant,
// by the holders' own timestamps, and every renew and release succeeds.
func TestConcurrencyAcrossThreeNodes(t *testing.T) {
	r := redistest.Start(t)
	// Slots live long here: a holder starved of CPU for seconds between
	// its check and its renew must still hold its slot.
	p := fiveSlots
	p.Limit.Period = 30 * time.Second
	var clients []*quotadclient.Client
	for i := range 3 {
		url := startSlotNode(t, r, p)
		clients = append(clients, newClient(t, url, []quotadclient.Protocol{quotadclient.ProtocolConnect, quotadclient.ProtocolGRPC, quotadclient.ProtocolGRPCWeb}[i]))
	}
	const holders, rounds = 50, 2
	var (
		mu       sync.Mutex
		held     []holding
		denials  int
		failures []string
		wg       sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	began := time.Now()
	deadline := began.Add(60 * time.Second)
	for h := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[h%3]
			rng := rand.New(rand.NewPCG(uint64(h), 16))
			ctx := context.Background()
			for round := 0; round < rounds; {
				if time.Now().After(deadline) {
					fail("holder %d: only %d rounds in 60s", h, round)
					return
				}
				asked := time.Now()
				d, err := c.Check(ctx, "gpu", "model-x", 1)
				if err != nil {
					fail("holder %d: check: %v", h, err)
					return
				}
				if d.Source != quotadclient.SourceStore {
					fail("holder %d: check decided by %s", h, d.Source)
				}
				if !d.Allowed {
					mu.Lock()
					denials++
					mu.Unlock()
					time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond) // back off, then try again
					continue
				}
				from := time.Now()
				ref := quotadclient.SlotRef{Policy: "gpu", Key: "model-x", ID: d.Slot}
				time.Sleep(time.Duration(1+rng.IntN(10)) * time.Millisecond) // the work
				if rng.IntN(3) == 0 {
					if _, err := c.RenewSlot(ctx, ref); err != nil {
						fail("holder %d: renew %s after the check was sent: %v", h, time.Since(asked), err)
					}
				}
				to := time.Now()
				if _, err := c.ReleaseSlot(ctx, ref); err != nil {
					fail("holder %d: release %s after the check was sent: %v", h, time.Since(asked), err)
				}
				mu.Lock()
				held = append(held, holding{from, to})
				mu.Unlock()
				round++
			}
		}()
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	most := maxOverlap(held)
	t.Logf("%d holdings by %d holders over 3 nodes in %s, %d denials; at most %d held at once (limit 5)", len(held), holders, time.Since(began).Round(time.Millisecond), denials, most)
	if most > 5 {
		t.Fatalf("%d slots held at once, limit 5", most)
	}
	if most < 3 || denials == 0 {
		t.Errorf("the holders hardly competed (at most %d at once, %d denials): the test proves little", most, denials)
	}
	if free := freeSlots(t, clients[0], "gpu", nil, "model-x"); free != 5 {
		t.Errorf("%d slots free after every holder released, want 5", free)
	}
}

// holderEnv tells TestSlotHolderProcess, run as a subprocess, where to
// take slots: "<quotad URL> <slots>".
const holderEnv = "QUOTAD_TEST_SLOT_HOLDER"

// TestSlotHolderProcess is not a test: TestSlotsOfAKilledHolderExpire runs
// the test binary again with only this test and holderEnv set, as a client
// process that takes slots, prints their ids on one line, and renews them
// every 200 ms until it is killed.
func TestSlotHolderProcess(t *testing.T) {
	spec := os.Getenv(holderEnv)
	if spec == "" {
		t.Skip("a helper process of TestSlotsOfAKilledHolderExpire")
	}
	url, count, _ := strings.Cut(spec, " ")
	n, _ := strconv.Atoi(count)
	c, err := quotadclient.New(url, quotadclient.Options{})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ctx := context.Background()
	var refs []quotadclient.SlotRef
	for range n {
		d, err := c.Check(ctx, "gpu", "model-x", 1)
		if err != nil || !d.Allowed {
			fmt.Println("error", d, err)
			os.Exit(1)
		}
		refs = append(refs, quotadclient.SlotRef{Policy: "gpu", Key: "model-x", ID: d.Slot})
	}
	ids := make([]string, len(refs))
	for i, ref := range refs {
		ids[i] = ref.ID
	}
	fmt.Println("held", strings.Join(ids, " "))
	for {
		time.Sleep(200 * time.Millisecond)
		for _, ref := range refs {
			if _, err := c.RenewSlot(ctx, ref); err != nil {
				fmt.Println("error", err)
			}
		}
	}
}

// A client process holding 3 of 5 slots, and renewing them, keeps them
// past their period; SIGKILLed, it stops renewing, and the slots are free
// again within their period (2 s) of the kill. Its ids are then gone.
func TestSlotsOfAKilledHolderExpire(t *testing.T) {
	r := redistest.Start(t)
	url := startSlotNode(t, r, fiveSlots)
	c := newClient(t, url, quotadclient.ProtocolConnect)
	period := fiveSlots.Limit.Period

	cmd := exec.Command(os.Args[0], "-test.run=^TestSlotHolderProcess$")
	cmd.Env = append(os.Environ(), holderEnv+"="+url+" 3")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readerDone := make(chan struct{})
	t.Cleanup(func() {
		// Killed already unless the test failed first; reads end at EOF,
		// and only then may Wait close the pipe.
		_ = cmd.Process.Kill()
		<-readerDone
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "held ") {
		close(readerDone)
		t.Fatalf("the holder process said %q (%v)", lines.Text(), lines.Err())
	}
	taken := time.Now()
	ids := strings.Fields(strings.TrimPrefix(lines.Text(), "held "))
	// Keep reading, so that the holder never blocks on a full pipe.
	go func() {
		defer close(readerDone)
		for lines.Scan() {
			t.Logf("holder: %s", lines.Text())
		}
	}()
	if free := freeSlots(t, c, "gpu", nil, "model-x"); free != 2 {
		t.Fatalf("%d slots free while the holder holds 3 of 5", free)
	}
	// Alive and renewing, it keeps them past a period.
	for time.Since(taken) < period+period/2 {
		time.Sleep(50 * time.Millisecond)
	}
	if free := freeSlots(t, c, "gpu", nil, "model-x"); free != 2 {
		t.Fatalf("%s after they were taken, %d slots free: renewing did not keep them", time.Since(taken), free)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	first := true
	for {
		free := freeSlots(t, c, "gpu", nil, "model-x")
		since := time.Since(killed)
		if free == 5 {
			t.Logf("the killed holder's 3 slots were free %s after SIGKILL (period %s)", since.Round(time.Millisecond), period)
			// Polling and the check's round trip add to the true moment;
			// a second is generous for both on a loaded machine.
			if since > period+time.Second {
				t.Errorf("freed %s after the kill, want within the period %s", since, period)
			}
			break
		}
		if first && since < period/2 && free != 2 {
			t.Fatalf("%d slots free %s after the kill: they were freed by something else than expiry", free, since)
		}
		first = false
		if since > 10*period {
			t.Fatalf("%d slots free %s after the kill", free, since)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range ids {
		if _, err := c.ReleaseSlot(context.Background(), quotadclient.SlotRef{Policy: "gpu", Key: "model-x", ID: id}); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("release of the dead holder's slot %s: %v, want NotFound", id, err)
		}
	}
}
