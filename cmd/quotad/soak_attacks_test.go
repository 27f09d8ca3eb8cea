package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/attack"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// soakAttacks are issue 10's attacks of items 3 to 8, all against one
// node at once, each at a bounded rate: what they cost the attacker's side
// is small next to what they ask of the server, so that on a 2-core
// machine the soak shows the server's defences, not the attacker's CPU.
type soakAttacks struct {
	target *proc
	wg     sync.WaitGroup

	// Items 3-5: gossip forged in the clear and, by a key holder who is
	// not a member, sealed; with reset floods; and captured gossip played
	// again.
	forger   *attack.GossipForger
	replayer *attack.GossipReplayer
	tap      *attack.Tap
	// Item 6: distinct 1 KiB keys with long inline periods.
	flood *attack.KeyFlood
	// Item 7: idle keep-alive, silent and idle h2c connections beyond the
	// connection cap; trickled bodies; rapid reset.
	idle     []*attack.IdleConns
	trickles []*attack.Trickle
	reset    *attack.RapidReset
	// Item 8: gzip bombs of 2 MiB inflating to 2 GiB.
	bombs *attack.Bombs

	gossipBefore clusterView
	// cutWhileTrickling is how many trickled requests the server had cut
	// when the attacks stopped (while they were still sending).
	cutWhileTrickling int64
}

// newSoakAttacks makes the attacks on target that only names; gentle makes
// them (but the idle connections) send a quarter as often, the key flood
// in smaller batches too (for a race-detector build, which spends several
// times more on each request, on both sides).
func newSoakAttacks(t *testing.T, target *proc, tap *attack.Tap, gossipKey []byte, gentle bool, only map[string]bool) *soakAttacks {
	t.Helper()
	// every is d, or four times d when gentle.
	every := func(d time.Duration) time.Duration {
		if gentle {
			return 4 * d
		}
		return d
	}
	batch := 250
	if gentle {
		batch = 100
	}
	addr := strings.TrimPrefix(target.api, "http://")
	gossipAddr := "127.0.0.1:" + target.gossipPort(t)
	// The compressed message, with gRPC's 5-byte prefix, fits the default
	// --max-request-bytes (2 MiB), or it would be refused unread.
	bomb, _, err := attack.GzipBomb(2<<20-5, 2<<30)
	if err != nil {
		t.Fatal(err)
	}
	victims := make([]attack.Victim, len(soakPolicies))
	for i, p := range soakPolicies {
		victims[i] = attack.Victim{Policy: p.name, Key: soakKey, Limit: p.limit}
	}
	// Each batch on a connection of its own: the flood is not the idle
	// connections' test.
	floodClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	a := &soakAttacks{
		target:   target,
		tap:      tap,
		forger:   &attack.GossipForger{Addr: gossipAddr, Key: gossipKey, Victims: victims, ResetsPerPacket: 40, Every: every(100 * time.Millisecond)},
		replayer: &attack.GossipReplayer{Addr: gossipAddr, Tap: tap, Key: gossipKey, PerRound: 20, Every: every(100 * time.Millisecond)},
		flood: &attack.KeyFlood{
			Client: quotadv1connect.NewQuotaServiceClient(floodClient, target.api), Namespace: "soak-flood",
			Batch: batch, KeyBytes: 1024, Period: 24 * time.Hour, LongPeriod: algorithms.MaxPeriod, MaxBatch: 1000,
			Every: every(500 * time.Millisecond),
		},
		// 210 idle connections and 20 trickled requests against a cap of
		// 200: the cap makes room by closing the longest idle. (Opening
		// them is cheap: gentle or not, they reach the cap in seconds.)
		idle: []*attack.IdleConns{
			{Addr: addr, Kind: attack.KeepAlive, N: 100, OpenEvery: 20 * time.Millisecond},
			{Addr: addr, Kind: attack.Silent, N: 50, OpenEvery: 20 * time.Millisecond},
			{Addr: addr, Kind: attack.H2C, N: 60, OpenEvery: 20 * time.Millisecond},
		},
		trickles: []*attack.Trickle{
			{Addr: addr, N: 10, Every: 200 * time.Millisecond, OpenEvery: every(50 * time.Millisecond)},
			{Addr: addr, N: 10, Every: 200 * time.Millisecond, OpenEvery: every(50 * time.Millisecond), H2: true},
		},
		reset: &attack.RapidReset{Addr: addr, Pairs: 1000, Every: every(250 * time.Millisecond)},
		bombs: &attack.Bombs{URL: target.api, Body: bomb, Every: every(500 * time.Millisecond)},
	}
	if !only["gossip"] {
		a.forger, a.replayer = nil, nil
	}
	if !only["flood"] {
		a.flood = nil
	}
	if !only["idle"] {
		a.idle = nil
	}
	if !only["trickle"] {
		a.trickles = nil
	}
	if !only["reset"] {
		a.reset = nil
	}
	if !only["bombs"] {
		a.bombs = nil
	}
	return a
}

// soakAttackNames are the attacks QUOTAD_SOAK_ATTACKS can choose from.
var soakAttackNames = []string{"gossip", "flood", "idle", "trickle", "reset", "bombs"}

// chosenAttacks reads QUOTAD_SOAK_ATTACKS, a comma-separated list of
// soakAttackNames (unset: all of them), to run some attacks alone (to see
// which costs the legit load what).
func chosenAttacks(t *testing.T) map[string]bool {
	t.Helper()
	only := make(map[string]bool)
	v := os.Getenv("QUOTAD_SOAK_ATTACKS")
	if v == "" {
		v = strings.Join(soakAttackNames, ",")
	}
	for _, name := range strings.Split(v, ",") {
		if !slices.Contains(soakAttackNames, name) {
			t.Fatalf("QUOTAD_SOAK_ATTACKS=%q: %q is none of %s", v, name, strings.Join(soakAttackNames, ", "))
		}
		only[name] = true
	}
	return only
}

// run starts every attack; they stop when ctx ends.
func (a *soakAttacks) run(ctx context.Context, t *testing.T) {
	t.Helper()
	var err error
	if a.gossipBefore, err = a.target.cluster(t); err != nil {
		t.Fatal(err)
	}
	var runners []interface{ Run(context.Context) }
	if a.forger != nil {
		runners = append(runners, a.forger, a.replayer)
	}
	if a.flood != nil {
		runners = append(runners, a.flood)
	}
	if a.reset != nil {
		runners = append(runners, a.reset)
	}
	if a.bombs != nil {
		runners = append(runners, a.bombs)
	}
	for _, r := range a.idle {
		runners = append(runners, r)
	}
	for _, r := range a.trickles {
		runners = append(runners, r)
	}
	for _, r := range runners {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			r.Run(ctx)
		}()
	}
}

// wait waits for every attack to stop; connections they hold stay open.
func (a *soakAttacks) wait() {
	a.wg.Wait()
	for _, tr := range a.trickles {
		a.cutWhileTrickling += tr.Stats().Cut
	}
}

// allClosed reports whether the server has closed every connection the
// attackers left open.
func (a *soakAttacks) allClosed() bool {
	for _, c := range a.idle {
		if c.Stats().Open > 0 {
			return false
		}
	}
	for _, tr := range a.trickles {
		if tr.Stats().Open > 0 {
			return false
		}
	}
	return true
}

func (a *soakAttacks) openConns() string {
	var b strings.Builder
	for _, c := range a.idle {
		fmt.Fprintf(&b, "%s %d, ", c.Kind, c.Stats().Open)
	}
	for _, tr := range a.trickles {
		fmt.Fprintf(&b, "trickle (h2 %t) %d, ", tr.H2, tr.Stats().Open)
	}
	return strings.TrimSuffix(b.String(), ", ")
}

// close closes what the attackers still hold.
func (a *soakAttacks) close() {
	for _, c := range a.idle {
		c.Close()
	}
	for _, tr := range a.trickles {
		tr.Close()
	}
}

func (a *soakAttacks) gossipAfter(t *testing.T) clusterView {
	t.Helper()
	v, err := a.target.cluster(t)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (a *soakAttacks) report(t *testing.T) {
	t.Helper()
	g, b := a.gossipAfter(t).Gossip, a.gossipBefore.Gossip
	if a.forger != nil {
		t.Logf("items 3-5, gossip: %+v forged, %+v replayed (of %d datagrams captured by the tap); node-1 since: %d unknown sender, %d replayed, %d stale, %d capped, %d resets applied, %d denials applied (the peers' own included)",
			a.forger.Stats(), a.replayer.Stats(), len(a.tap.Captured()), g.UnknownSender-b.UnknownSender, g.Replayed-b.Replayed, g.Stale-b.Stale,
			g.Capped-b.Capped, g.ResetsReceived-b.ResetsReceived, g.DenialsReceived-b.DenialsReceived)
	}
	if a.flood != nil {
		t.Logf("item 6, key flood: %+v", a.flood.Stats())
	}
	for _, c := range a.idle {
		t.Logf("item 7, idle %s: %+v", c.Kind, c.Stats())
	}
	for _, tr := range a.trickles {
		t.Logf("item 7, trickled bodies (h2 %t): %+v", tr.H2, tr.Stats())
	}
	if a.reset != nil {
		t.Logf("item 7, rapid reset: %+v (%d HEADERS+RST pairs sent per connection)", a.reset.Stats(), a.reset.Pairs)
	}
	if a.bombs != nil {
		t.Logf("item 8, gzip bombs: %+v", a.bombs.Stats())
	}
}

// check fails the test unless every attack was refused or closed as the
// defences of issue 10 mean it to be.
func (a *soakAttacks) check(t *testing.T) {
	t.Helper()
	g, b := a.gossipAfter(t).Gossip, a.gossipBefore.Gossip
	// Whatever runs, no forged denial or reset may take.
	if g.Capped != b.Capped || g.ResetsReceived != b.ResetsReceived {
		t.Errorf("node-1 applied forged gossip: %d capped denials, %d resets", g.Capped-b.Capped, g.ResetsReceived-b.ResetsReceived)
	}
	if a.forger != nil {
		if f := a.forger.Stats(); f.Clear == 0 || f.Sealed == 0 || f.Failed > 0 {
			t.Errorf("gossip forger: %+v", f)
		}
		if g.UnknownSender == b.UnknownSender {
			t.Error("node-1 counted no gossip from an unknown sender: the sealed forgeries did not reach its gossip")
		}
		if !a.target.stderr.contains("Decrypt packet failed") {
			t.Error("node-1 never said it dropped an undecryptable gossip packet")
		}
		if r := a.replayer.Stats(); r.Replayed == 0 {
			t.Error("the tap captured no gossip to replay")
		} else if g.Replayed+g.Stale == b.Replayed+b.Stale {
			t.Errorf("node-1 counted no replayed or stale gossip after %d replays", r.Replayed)
		}
	}

	if a.flood != nil {
		if f := a.flood.Stats(); f.Batches == 0 || f.Allowed == 0 || f.LongInvalid == 0 || f.OversizeRefused == 0 || f.Other > 0 {
			t.Errorf("key flood: %+v; want batches of 24h limits decided, 365-day limits InvalidArgument, oversized batches refused, nothing else", f)
		}
	}

	for _, c := range a.idle {
		if s := c.Stats(); s.Opened == 0 || s.Open > 0 || s.ClosedByServer != s.Opened {
			t.Errorf("idle %s connections: %+v; want every one closed by the server", c.Kind, s)
		}
	}
	for _, tr := range a.trickles {
		if s := tr.Stats(); s.Started == 0 || s.Open > 0 || s.Cut != s.Started {
			t.Errorf("trickled bodies (h2 %t): %+v; want every one cut by the server", tr.H2, s)
		}
	}
	if a.trickles != nil && a.cutWhileTrickling == 0 {
		t.Error("no trickled body was cut while the attack still sent it")
	}
	if a.reset != nil {
		if s := a.reset.Stats(); s.Conns == 0 || s.GoAways != s.Conns || s.Streams >= s.Conns*int64(a.reset.Pairs) {
			t.Errorf("rapid reset: %+v; want a GOAWAY ENHANCE_YOUR_CALM on every connection, before its last stream", s)
		}
	}
	if a.bombs != nil {
		// A loaded machine may read a 2 MiB body more slowly than the read
		// timeout allows: cut then, it is refused all the same.
		if s := a.bombs.Stats(); s.Sent == 0 || s.Refused+s.TimedOut != s.Sent {
			t.Errorf("gzip bombs: %+v; want every one refused: ResourceExhausted, or DeadlineExceeded past the read timeout", s)
		}
	}
}
