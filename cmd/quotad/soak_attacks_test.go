package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/attack"
	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// The soak's attackers run in a process of their own: this test binary
// again, in the hidden mode of TestSoakAttacker. In a deployment the
// attackers are other machines: what they spend on making their packets
// and requests is not taken from the node's cores, nor from its other
// clients'. On the soak's one machine it would be (the last in-process
// run spent 12.8 s of CPU on attackers and legit clients in a 60 s phase,
// on 2 cores, and the unattacked nodes' p99 rose with node 1's). So the
// attacker process runs, in `make soak`, under the scheduling policy
// SCHED_IDLE: it gets a core only when the nodes, Redis and the legit
// clients leave one idle, which they mostly do, and never delays them.
// What it achieved (packets, requests, connections a second, and the
// fraction of its configured rounds) is in the test log, and with
// QUOTAD_SOAK_QUIET=1 each attack must have run at least soakMinVolume of
// its configured rounds: the soak cannot pass by starving its attackers.
// The short soak of `make test` (a loaded machine, where an idle-priority
// process could get no CPU at all, and no latency is asserted) runs them
// at normal priority.

// soakAttackerEnv carries the attacker process's soakAttackPlan (JSON).
const soakAttackerEnv = "QUOTAD_SOAK_ATTACKER"

// soakMinVolume is the least fraction of its configured rounds (or, for
// the idle connections and trickled bodies, of the connections it is to
// hold) each attack must achieve when QUOTAD_SOAK_QUIET=1.
const soakMinVolume = 0.5

// soakAttackPlan is what the attacker process attacks, and how hard.
type soakAttackPlan struct {
	// API is the target's base URL; Gossip its gossip host:port.
	API, Gossip string
	GossipKey   []byte
	// Gentle makes the attacks (but the idle connections) send a quarter
	// as often, the key flood in smaller batches too (for a race-detector
	// build, which spends several times more on each request, on both
	// sides).
	Gentle bool
	Only   map[string]bool
}

// soakAttackSet is the soak's attacks, all against one
// node at once, each at a bounded rate, in the attacker process.
type soakAttackSet struct {
	// Gossip forged in the clear and, by a key holder who is
	// not a member, sealed; with reset floods; and captured gossip played
	// again (what the soak's tap copies to capture).
	forger   *attack.GossipForger
	replayer *attack.GossipReplayer
	capture  *attack.Tap
	// Distinct 1 KiB keys with long inline periods.
	flood *attack.KeyFlood
	// Idle keep-alive, silent and idle h2c connections beyond the
	// connection cap; trickled bodies; rapid reset.
	idle     []*attack.IdleConns
	trickles []*attack.Trickle
	reset    *attack.RapidReset
	// Gzip bombs of 2 MiB inflating to 2 GiB.
	bombs *attack.Bombs

	wg             sync.WaitGroup
	mu             sync.Mutex
	peakIdle       []int
	peakTrickle    []int
	started, ended time.Time
	stoppedStats   *soakAttackStats
}

func newSoakAttackSet(plan soakAttackPlan) (*soakAttackSet, error) {
	// every is d, or four times d when gentle.
	every := func(d time.Duration) time.Duration {
		if plan.Gentle {
			return 4 * d
		}
		return d
	}
	batch := 250
	if plan.Gentle {
		batch = 100
	}
	addr := strings.TrimPrefix(plan.API, "http://")
	// The compressed message, with gRPC's 5-byte prefix, fits the default
	// --max-request-bytes (2 MiB), or it would be refused unread.
	bomb, _, err := attack.GzipBomb(2<<20-5, 2<<30)
	if err != nil {
		return nil, err
	}
	capture, err := attack.StartTap()
	if err != nil {
		return nil, err
	}
	victims := make([]attack.Victim, len(soakPolicies))
	for i, p := range soakPolicies {
		victims[i] = attack.Victim{Policy: p.name, Key: soakKey, Limit: p.limit}
	}
	// Each batch on a connection of its own: the flood is not the idle
	// connections' test.
	floodClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	s := &soakAttackSet{
		capture:  capture,
		forger:   &attack.GossipForger{Addr: plan.Gossip, Key: plan.GossipKey, Victims: victims, ResetsPerPacket: 40, Every: every(100 * time.Millisecond)},
		replayer: &attack.GossipReplayer{Addr: plan.Gossip, Source: capture, Key: plan.GossipKey, PerRound: 20, Every: every(100 * time.Millisecond)},
		flood: &attack.KeyFlood{
			Client: quotadv1connect.NewQuotaServiceClient(floodClient, plan.API), Namespace: "soak-flood",
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
		// A connection at a time, each open until the server's GOAWAY
		// and close (a second after it): about one a second.
		reset: &attack.RapidReset{Addr: addr, Pairs: 1000, Every: time.Second},
		bombs: &attack.Bombs{URL: plan.API, Body: bomb, Every: every(500 * time.Millisecond)},
	}
	if !plan.Only["gossip"] {
		s.forger, s.replayer = nil, nil
	}
	if !plan.Only["flood"] {
		s.flood = nil
	}
	if !plan.Only["idle"] {
		s.idle = nil
	}
	if !plan.Only["trickle"] {
		s.trickles = nil
	}
	if !plan.Only["reset"] {
		s.reset = nil
	}
	if !plan.Only["bombs"] {
		s.bombs = nil
	}
	s.peakIdle, s.peakTrickle = make([]int, len(s.idle)), make([]int, len(s.trickles))
	return s, nil
}

// run starts every attack; they stop when ctx ends. stopped is called
// once they all have.
func (s *soakAttackSet) run(ctx context.Context, stopped func()) {
	var runners []interface{ Run(context.Context) }
	if s.forger != nil {
		runners = append(runners, s.forger, s.replayer)
	}
	if s.flood != nil {
		runners = append(runners, s.flood)
	}
	if s.reset != nil {
		runners = append(runners, s.reset)
	}
	if s.bombs != nil {
		runners = append(runners, s.bombs)
	}
	for _, r := range s.idle {
		runners = append(runners, r)
	}
	for _, r := range s.trickles {
		runners = append(runners, r)
	}
	s.mu.Lock()
	s.started = time.Now()
	s.mu.Unlock()
	for _, r := range runners {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			r.Run(ctx)
		}()
	}
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		s.ended = time.Now()
		s.mu.Unlock()
		s.wg.Wait()
		st := s.stats()
		st.Stopped = true
		for _, tr := range st.Trickles {
			st.CutWhileTrickling += tr.Cut
		}
		st.Volumes = s.volumes(st)
		s.mu.Lock()
		s.stoppedStats = &st
		s.mu.Unlock()
		stopped()
	}()
}

// soakAttackStats are the attacker process's counts, as it reports them
// to the soak. A nil field is an attack not chosen.
type soakAttackStats struct {
	// Stopped says every attack has stopped (what they hold stays open);
	// CutWhileTrickling is how many trickled requests the server had cut
	// by then, while they were still sending; RanFor is how long they
	// ran; Volumes what each achieved, once stopped.
	Stopped           bool
	CutWhileTrickling int64
	RanFor            time.Duration
	Volumes           []soakVolume

	Forger   *attack.ForgerStats
	Replayer *attack.ReplayerStats
	Captured int
	Flood    *attack.KeyFloodStats
	Idle     []soakIdleStats
	Trickles []soakTrickleStats
	Reset    *attack.RapidResetStats
	Pairs    int
	Bombs    *attack.BombStats
}

type soakIdleStats struct {
	Kind     string
	N        int
	PeakOpen int
	attack.IdleStats
}

type soakTrickleStats struct {
	H2       bool
	N        int
	PeakOpen int
	attack.TrickleStats
}

// soakVolume is what one attack achieved: in words (Achieved), and as
// the fraction of its configured rounds it ran (Fraction).
type soakVolume struct {
	Attack, Achieved string
	Fraction         float64
}

// stats reads every attack's counts, and keeps the peaks of the
// connections held.
func (s *soakAttackSet) stats() soakAttackStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st soakAttackStats
	if !s.started.IsZero() {
		end := s.ended
		if end.IsZero() {
			end = time.Now()
		}
		st.RanFor = end.Sub(s.started)
	}
	if s.forger != nil {
		f, r := s.forger.Stats(), s.replayer.Stats()
		st.Forger, st.Replayer, st.Captured = &f, &r, len(s.capture.Captured())
	}
	if s.flood != nil {
		f := s.flood.Stats()
		st.Flood = &f
	}
	for i, c := range s.idle {
		cs := c.Stats()
		s.peakIdle[i] = max(s.peakIdle[i], cs.Open)
		st.Idle = append(st.Idle, soakIdleStats{Kind: c.Kind.String(), N: c.N, PeakOpen: s.peakIdle[i], IdleStats: cs})
	}
	for i, tr := range s.trickles {
		ts := tr.Stats()
		s.peakTrickle[i] = max(s.peakTrickle[i], ts.Open)
		st.Trickles = append(st.Trickles, soakTrickleStats{H2: tr.H2, N: tr.N, PeakOpen: s.peakTrickle[i], TrickleStats: ts})
	}
	if s.reset != nil {
		r := s.reset.Stats()
		st.Reset, st.Pairs = &r, s.reset.Pairs
	}
	if s.bombs != nil {
		b := s.bombs.Stats()
		st.Bombs = &b
	}
	if s.stoppedStats != nil {
		// The counts go on (the server closes what is left); the volumes
		// stay those of the attacks.
		st.Stopped, st.CutWhileTrickling, st.Volumes = true, s.stoppedStats.CutWhileTrickling, s.stoppedStats.Volumes
	}
	return st
}

// volumes says what each attack in st achieved over st.RanFor.
func (s *soakAttackSet) volumes(st soakAttackStats) []soakVolume {
	secs := max(st.RanFor.Seconds(), 1e-3)
	// rounds is how many rounds a ticker of every fits in the run.
	rounds := func(every time.Duration) float64 { return max(1, st.RanFor.Seconds()/every.Seconds()) }
	var v []soakVolume
	if f := st.Forger; f != nil {
		// Each round sends two sealed packets.
		v = append(v, soakVolume{"gossip forged", fmt.Sprintf("%.0f packets/s (%.0f sealed)", float64(f.Clear+f.Sealed)/secs, float64(f.Sealed)/secs),
			float64(f.Sealed/2) / rounds(s.forger.Every)})
		r := st.Replayer
		v = append(v, soakVolume{"gossip replayed", fmt.Sprintf("%.0f packets/s", float64(r.Replayed)/secs), float64(r.Rounds) / rounds(s.replayer.Every)})
	}
	if f := st.Flood; f != nil {
		v = append(v, soakVolume{"key flood", fmt.Sprintf("%.1f CheckBatch/s, %.0f new keys/s", float64(f.Batches)/secs, float64(f.Batches*int64(s.flood.Batch))/secs),
			float64(f.Batches) / rounds(s.flood.Every)})
	}
	for _, c := range st.Idle {
		v = append(v, soakVolume{"idle " + c.Kind, fmt.Sprintf("%d held at most, %.1f opened/s", c.PeakOpen, float64(c.Opened)/secs), float64(c.PeakOpen) / float64(c.N)})
	}
	for _, tr := range st.Trickles {
		v = append(v, soakVolume{fmt.Sprintf("trickled bodies (h2 %t)", tr.H2), fmt.Sprintf("%d open at most, %.1f started/s", tr.PeakOpen, float64(tr.Started)/secs),
			float64(tr.PeakOpen) / float64(tr.N)})
	}
	if r := st.Reset; r != nil {
		v = append(v, soakVolume{"rapid reset", fmt.Sprintf("%.2f connections/s, %.0f HEADERS+RST pairs/s", float64(r.Conns)/secs, float64(r.Conns*int64(st.Pairs))/secs),
			float64(r.Conns+r.DialFailed) / rounds(s.reset.Every)})
	}
	if b := st.Bombs; b != nil {
		v = append(v, soakVolume{"gzip bombs", fmt.Sprintf("%.2f bombs/s (%.1f MiB/s)", float64(b.Sent)/secs, float64(b.Sent)*float64(len(s.bombs.Body))/(1<<20)/secs),
			float64(b.Sent) / rounds(s.bombs.Every)})
	}
	return v
}

// close closes what the attackers still hold.
func (s *soakAttackSet) close() {
	for _, c := range s.idle {
		c.Close()
	}
	for _, tr := range s.trickles {
		tr.Close()
	}
	s.capture.Close()
}

// soakAttackerLine prefixes what the attacker process says to the soak on
// its stdout (the rest is the test framework's).
const soakAttackerLine = "soak-attacker "

// TestSoakAttacker is the soak's attacker process (soakAttackerEnv set;
// otherwise it skips). It says its capture address, then, told "run
// DEADLINE" (Unix nanoseconds) on stdin, attacks until then, saying its
// counts every 250 ms; told "close" (or at the end of stdin) it closes
// what it holds and ends.
func TestSoakAttacker(t *testing.T) {
	raw := os.Getenv(soakAttackerEnv)
	if raw == "" {
		t.Skip("the soak's attacker process, which TestSoakAttacksOnOneNode starts")
	}
	var plan soakAttackPlan
	if err := json.Unmarshal([]byte(raw), &plan); err != nil {
		t.Fatal(err)
	}
	s, err := newSoakAttackSet(plan)
	if err != nil {
		t.Fatal(err)
	}
	var outMu sync.Mutex
	say := func(kind string, v any) {
		b, _ := json.Marshal(v)
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, "%s%s %s\n", soakAttackerLine, kind, b)
	}
	say("capture", s.capture.Addr())
	done := make(chan struct{})
	defer close(done)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "run":
			ns, err := strconv.ParseInt(arg, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, ns))
			defer cancel()
			profileAttackers(t, ctx)
			s.run(ctx, func() { say("stats", s.stats()) })
			go func() {
				tick := time.NewTicker(250 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-done:
						return
					case <-tick.C:
						say("stats", s.stats())
					}
				}
			}()
		case "close":
			s.close()
			say("closed", s.stats())
			return
		}
	}
	s.close()
}

// profileAttackers writes the attackers' CPU profile of the attack phase
// (until ctx ends) to attackers.cpu.pprof in QUOTAD_SOAK_PROFILE's
// directory, if set: what the attacks cost the machine beside node 1. It
// stops before the process is told to close, which may kill it.
func profileAttackers(t *testing.T, ctx context.Context) {
	dir := os.Getenv("QUOTAD_SOAK_PROFILE")
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, "attackers.cpu.pprof"))
	if err != nil {
		t.Error(err)
		return
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		t.Error(err)
		return
	}
	go func() {
		<-ctx.Done()
		pprof.StopCPUProfile()
		_ = f.Close()
	}()
}

// soakAttacks is the soak's handle on its attacker process.
type soakAttacks struct {
	target *proc
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	output *lockedBuffer // what it said that was not for the soak
	idle   bool          // it runs under SCHED_IDLE

	mu       sync.Mutex
	last     soakAttackStats
	stopped  chan struct{} // closed once it says the attacks have stopped
	closed   chan struct{} // closed once it has closed what it held
	exited   chan struct{}
	waitErr  error
	gossipAt clusterView // node 1's gossip counts before the attacks
}

// startSoakAttacks starts the attacker process against target, at idle
// priority when idle is set; the tap copies what it captures to it.
func startSoakAttacks(t *testing.T, plan soakAttackPlan, target *proc, tap *attack.Tap, idle bool) *soakAttacks {
	t.Helper()
	raw, err := json.Marshal(plan)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSoakAttacker$", "-test.count=1")
	cmd.Env = append(os.Environ(), soakAttackerEnv+"="+string(raw))
	a := &soakAttacks{target: target, cmd: cmd, output: &lockedBuffer{}, idle: idle,
		stopped: make(chan struct{}), closed: make(chan struct{}), exited: make(chan struct{})}
	cmd.Stderr = a.output
	if a.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if idle {
		err = startSchedIdle(cmd)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-a.exited
	})
	capture := make(chan string, 1)
	go func() {
		defer func() {
			a.waitErr = cmd.Wait()
			close(a.exited)
		}()
		lines := bufio.NewScanner(stdout)
		lines.Buffer(nil, 1<<20)
		var stoppedOnce, closedOnce sync.Once
		for lines.Scan() {
			kind, body, ok := strings.Cut(strings.TrimPrefix(lines.Text(), soakAttackerLine), " ")
			if !ok || !strings.HasPrefix(lines.Text(), soakAttackerLine) {
				fmt.Fprintln(a.output, lines.Text())
				continue
			}
			if kind == "capture" {
				var addr string
				_ = json.Unmarshal([]byte(body), &addr)
				capture <- addr
				continue
			}
			var st soakAttackStats
			if err := json.Unmarshal([]byte(body), &st); err != nil {
				fmt.Fprintf(a.output, "unreadable stats: %v: %s\n", err, body)
				continue
			}
			a.mu.Lock()
			a.last = st
			a.mu.Unlock()
			if st.Stopped {
				stoppedOnce.Do(func() { close(a.stopped) })
			}
			if kind == "closed" {
				closedOnce.Do(func() { close(a.closed) })
			}
		}
	}()
	select {
	case addr := <-capture:
		if err := tap.CopyTo(addr); err != nil {
			t.Fatal(err)
		}
	case <-a.exited:
		t.Fatalf("the attacker process ended before it began: %v\n%s", a.waitErr, a.output.tail())
	case <-time.After(time.Minute):
		t.Fatalf("the attacker process said nothing in a minute:\n%s", a.output.tail())
	}
	return a
}

// schedPolicy is process pid's scheduling policy, from /proc.
func schedPolicy(pid int) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	if len(f) < 39 {
		return "unknown"
	}
	// Field 41 of stat(5); f starts at field 3.
	switch f[38] {
	case "0":
		return "SCHED_OTHER"
	case "3":
		return "SCHED_BATCH"
	case "5":
		return "SCHED_IDLE"
	}
	return "policy " + f[38]
}

func (a *soakAttacks) stats() soakAttackStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// run starts every attack, until ctx's deadline.
func (a *soakAttacks) run(ctx context.Context, t *testing.T) {
	t.Helper()
	var err error
	if a.gossipAt, err = a.target.cluster(t); err != nil {
		t.Fatal(err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		t.Fatal("the attacks need a deadline")
	}
	if _, err := fmt.Fprintf(a.stdin, "run %d\n", deadline.UnixNano()); err != nil {
		t.Fatalf("the attacker process: %v\n%s", err, a.output.tail())
	}
}

// wait waits for every attack to stop; connections they hold stay open.
func (a *soakAttacks) wait(t *testing.T) {
	t.Helper()
	select {
	case <-a.stopped:
	case <-a.exited:
		t.Fatalf("the attacker process ended during the attacks: %v\n%s", a.waitErr, a.output.tail())
	}
}

// cpu is the attacker process's CPU time so far.
func (a *soakAttacks) cpu() time.Duration {
	cpu, _, err := quotadtest.ProcStat(a.cmd.Process.Pid)
	if err != nil {
		return 0
	}
	return cpu
}

// allClosed reports whether the server has closed every connection the
// attackers left open.
func (a *soakAttacks) allClosed() bool {
	st := a.stats()
	for _, c := range st.Idle {
		if c.Open > 0 {
			return false
		}
	}
	for _, tr := range st.Trickles {
		if tr.Open > 0 {
			return false
		}
	}
	return true
}

func (a *soakAttacks) openConns() string {
	st := a.stats()
	var parts []string
	for _, c := range st.Idle {
		parts = append(parts, fmt.Sprintf("%s %d", c.Kind, c.Open))
	}
	for _, tr := range st.Trickles {
		parts = append(parts, fmt.Sprintf("trickle (h2 %t) %d", tr.H2, tr.Open))
	}
	return strings.Join(parts, ", ")
}

// close has the attacker process close what it still holds, and end.
func (a *soakAttacks) close(t *testing.T) {
	t.Helper()
	_, _ = fmt.Fprintln(a.stdin, "close")
	select {
	case <-a.closed:
	case <-a.exited:
	case <-time.After(30 * time.Second):
		t.Errorf("the attacker process did not close its connections in 30s:\n%s", a.output.tail())
	}
	a.stdin.Close()
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
	st := a.stats()
	g, b := a.gossipAfter(t).Gossip, a.gossipAt.Gossip
	policy := "normal priority"
	if a.idle {
		policy = "SCHED_IDLE"
	}
	t.Logf("the attackers (a process of their own, %s) ran %s; what each achieved:", policy, st.RanFor.Round(10*time.Millisecond))
	for _, v := range st.Volumes {
		t.Logf("  %s: %s (%.2f of its configured rounds or connections)", v.Attack, v.Achieved, v.Fraction)
	}
	if st.Forger != nil {
		t.Logf("gossip: %+v forged, %+v replayed (of %d datagrams captured through the tap); node-1 since: %d unknown sender, %d replayed, %d stale, %d capped, %d resets applied, %d denials applied (the peers' own included)",
			*st.Forger, *st.Replayer, st.Captured, g.UnknownSender-b.UnknownSender, g.Replayed-b.Replayed, g.Stale-b.Stale,
			g.Capped-b.Capped, g.ResetsReceived-b.ResetsReceived, g.DenialsReceived-b.DenialsReceived)
	}
	if st.Flood != nil {
		t.Logf("key flood: %+v", *st.Flood)
	}
	for _, c := range st.Idle {
		t.Logf("idle %s: %+v", c.Kind, c.IdleStats)
	}
	for _, tr := range st.Trickles {
		t.Logf("trickled bodies (h2 %t): %+v", tr.H2, tr.TrickleStats)
	}
	if st.Reset != nil {
		t.Logf("rapid reset: %+v (%d HEADERS+RST pairs sent per connection)", *st.Reset, st.Pairs)
	}
	if st.Bombs != nil {
		t.Logf("gzip bombs: %+v", *st.Bombs)
	}
}

// check fails the test unless every attack was refused or closed as its
// defence means it to be; with volumes, unless each ran at
// least soakMinVolume of its configured rounds.
func (a *soakAttacks) check(t *testing.T, volumes bool) {
	t.Helper()
	st := a.stats()
	g, b := a.gossipAfter(t).Gossip, a.gossipAt.Gossip
	// Whatever runs, no forged denial or reset may take.
	if g.Capped != b.Capped || g.ResetsReceived != b.ResetsReceived {
		t.Errorf("node-1 applied forged gossip: %d capped denials, %d resets", g.Capped-b.Capped, g.ResetsReceived-b.ResetsReceived)
	}
	if volumes {
		for _, v := range st.Volumes {
			if v.Fraction < soakMinVolume {
				t.Errorf("%s ran %.2f of its configured rounds (%s), below %.2f: the attackers were starved, or the server slowed them down", v.Attack, v.Fraction, v.Achieved, soakMinVolume)
			}
		}
	}
	if f := st.Forger; f != nil {
		if f.Clear == 0 || f.Sealed == 0 || f.Failed > 0 {
			t.Errorf("gossip forger: %+v", *f)
		}
		if g.UnknownSender == b.UnknownSender {
			t.Error("node-1 counted no gossip from an unknown sender: the sealed forgeries did not reach its gossip")
		}
		if !a.target.stderr.contains("Decrypt packet failed") {
			t.Error("node-1 never said it dropped an undecryptable gossip packet")
		}
		if r := st.Replayer; r.Replayed == 0 {
			t.Error("the tap captured no gossip to replay")
		} else if g.Replayed+g.Stale == b.Replayed+b.Stale {
			t.Errorf("node-1 counted no replayed or stale gossip after %d replays", r.Replayed)
		}
	}

	if f := st.Flood; f != nil {
		if f.Batches == 0 || f.Allowed == 0 || f.LongInvalid == 0 || f.OversizeRefused == 0 || f.Other > 0 {
			t.Errorf("key flood: %+v; want batches of 24h limits decided, 365-day limits InvalidArgument, oversized batches refused, nothing else", *f)
		}
	}

	for _, c := range st.Idle {
		if c.Opened == 0 || c.Open > 0 || c.ClosedByServer != c.Opened {
			t.Errorf("idle %s connections: %+v; want every one closed by the server", c.Kind, c.IdleStats)
		}
	}
	for _, tr := range st.Trickles {
		if tr.Started == 0 || tr.Open > 0 || tr.Cut != tr.Started {
			t.Errorf("trickled bodies (h2 %t): %+v; want every one cut by the server", tr.H2, tr.TrickleStats)
		}
	}
	if st.Trickles != nil && st.CutWhileTrickling == 0 {
		t.Error("no trickled body was cut while the attack still sent it")
	}
	if r := st.Reset; r != nil {
		if r.Conns == 0 || r.GoAways != r.Conns || r.Streams >= r.Conns*int64(st.Pairs) {
			t.Errorf("rapid reset: %+v; want a GOAWAY ENHANCE_YOUR_CALM on every connection, before its last stream", *r)
		}
	}
	if bs := st.Bombs; bs != nil {
		// A loaded machine may read a 2 MiB body more slowly than the read
		// timeout allows: cut then, it is refused all the same.
		if bs.Sent == 0 || bs.Refused+bs.TimedOut != bs.Sent {
			t.Errorf("gzip bombs: %+v; want every one refused: ResourceExhausted, or DeadlineExceeded past the read timeout", *bs)
		}
	}
	select {
	case <-a.exited:
		if a.waitErr != nil {
			t.Errorf("the attacker process: %v\n%s", a.waitErr, a.output.tail())
		}
	default:
	}
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
