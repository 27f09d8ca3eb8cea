package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redisbench"
	"github.com/quotad/quotad/internal/redistest"
)

// TestMain lets the matrix re-run this test binary as the gRPC floor, as
// it re-runs quotabench outside tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == floorCommand {
		if err := runFloorServer(context.Background(), os.Args[2:], os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestParseStatCPU(t *testing.T) {
	// The command name holds a space and a ')'; utime 250, stime 50 ticks.
	stat := "4242 (quo tad)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 100 0 0\n"
	got, err := parseStatCPU([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if got != 3*time.Second {
		t.Fatalf("cpu %s, want 3s (300 ticks)", got)
	}
	if _, err := parseStatCPU([]byte("4242 (x) S 1 2")); err == nil {
		t.Fatal("a short stat line was accepted")
	}
}

func TestParseIOSyscalls(t *testing.T) {
	io := "rchar: 100\nwchar: 200\nsyscr: 7\nsyscw: 5\nread_bytes: 0\n"
	if n, err := parseIOSyscalls([]byte(io)); err != nil || n != 12 {
		t.Fatalf("got %d, %v; want 12", n, err)
	}
	if _, err := parseIOSyscalls([]byte("syscr: 7\n")); err == nil {
		t.Fatal("missing syscw accepted")
	}
}

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250001\r\nused_cpu_sys_children:9.000000\r\n"
	got, err := parseRedisCPU(info)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1750001 * time.Microsecond; got != want {
		t.Fatalf("cpu %s, want %s", got, want)
	}
	if _, err := parseRedisCPU("used_cpu_sys:1\r\n"); err == nil {
		t.Fatal("missing used_cpu_user accepted")
	}
}

// This process's own counters are readable and move forward.
func TestReadProcSelf(t *testing.T) {
	a, err := readProc(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile("/proc/self/stat"); err != nil || a.Syscalls < 0 {
		t.Fatalf("syscalls %d (%v): /proc/self/io unreadable", a.Syscalls, err)
	}
	// Some reads and writes and CPU of our own.
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := os.CreateTemp(t.TempDir(), "x")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = f.Write(make([]byte, 1024))
		f.Close()
		b, err := readProc(0)
		if err != nil {
			t.Fatal(err)
		}
		if b.Syscalls > a.Syscalls && b.CPU > a.CPU {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters did not move: %+v then %+v", a, b)
		}
	}
}

func TestFillRatios(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	cells := []cellResult{
		{Scenario: "hot-allowed", Via: "grpc", Clients: 16, Target: "grpc-floor", ServerCPUMicros: f(40)},
		{Scenario: "hot-allowed", Via: "grpc", Clients: 16, Target: "after", ServerCPUMicros: f(50)},
		{Scenario: "hot-allowed", Via: "rls", Clients: 16, Target: "after", ServerCPUMicros: f(50)},
		{Scenario: "cold", Via: "redis", Clients: 16, Target: "redis-floor", RedisCPUMicros: 10},
		{Scenario: "cold", Via: "grpc", Clients: 16, Target: "after", ServerCPUMicros: f(80), RedisCPUMicros: 25},
		{Scenario: "batch", Via: "grpc", Clients: 16, Target: "after", ServerCPUMicros: f(3)},
		{Scenario: "cold", Via: "grpc", Clients: 16, Target: "redis-floor@after", RedisCPUMicros: 20},
	}
	fillRatios(cells)
	if r := cells[4].RedisToPacedFloor; r == nil || *r != 1.25 {
		t.Fatalf("cold redis ratio to the paced floor %v, want 1.25", r)
	}
	if cells[6].RedisToFloor != nil || cells[6].RedisToPacedFloor != nil {
		t.Fatal("a paced floor got a ratio")
	}
	if r := cells[1].ServerToFloor; r == nil || *r != 1.25 {
		t.Fatalf("hot grpc ratio %v, want 1.25", r)
	}
	if cells[2].ServerToFloor != nil {
		t.Fatal("an rls cell got a ratio with no rls floor measured")
	}
	if r := cells[4].RedisToFloor; r == nil || *r != 2.5 {
		t.Fatalf("cold redis ratio %v, want 2.5", r)
	}
	if r := cells[4].ServerToFloor; r == nil || *r != 2 {
		t.Fatalf("cold server ratio %v, want 2", r)
	}
	if cells[5].ServerToFloor != nil {
		t.Fatal("a batch cell got a per-call floor ratio")
	}
	if cells[0].ServerToFloor != nil || cells[3].RedisToFloor != nil {
		t.Fatal("a floor got a ratio to itself")
	}
	if cells[4].RedisToLogFloor != nil || cells[4].RedisToLogScriptFloor != nil {
		t.Fatal("a cold cell got a ratio to a sorted-set floor its run did not measure")
	}
}

func TestFillRatiosToTheLogFloors(t *testing.T) {
	cells := []cellResult{
		{Scenario: "cold", Via: "redis", Clients: 16, Target: "redis-floor", RedisCPUMicros: 10},
		{Scenario: "cold", Via: "redis", Clients: 16, Target: logFloorName, RedisCPUMicros: 12},
		{Scenario: "cold", Via: "redis", Clients: 16, Target: logScriptFloorName, RedisCPUMicros: 15},
		{Scenario: "cold", Via: "grpc", Clients: 16, Target: "after", RedisCPUMicros: 18},
		{Scenario: "cold", Via: "grpc", Clients: 4, Target: "after", RedisCPUMicros: 18},
		{Scenario: "cold", Via: "grpc", Clients: 16, Target: "log-script-floor@after", RedisCPUMicros: 20},
	}
	fillRatios(cells)
	if r := cells[3].RedisToPacedLogScriptFloor; r == nil || *r != 0.9 {
		t.Fatalf("ratio to the paced scripted log floor %v, want 0.9", r)
	}
	if cells[4].RedisToPacedLogScriptFloor != nil || cells[5].RedisToPacedLogScriptFloor != nil || cells[5].RedisToLogScriptFloor != nil {
		t.Fatal("a paced floor, or a cell of another client count, got a ratio to the paced scripted log floor")
	}
	if r := cells[3].RedisToLogFloor; r == nil || *r != 1.5 {
		t.Fatalf("ratio to the pipelined log floor %v, want 1.5", r)
	}
	if r := cells[3].RedisToLogScriptFloor; r == nil || *r != 1.2 {
		t.Fatalf("ratio to the scripted log floor %v, want 1.2", r)
	}
	if cells[4].RedisToLogFloor != nil || cells[4].RedisToLogScriptFloor != nil {
		t.Fatal("a cell got a ratio to the log floors of another client count")
	}
	for _, c := range cells[:3] {
		if c.RedisToFloor != nil || c.RedisToLogFloor != nil || c.RedisToLogScriptFloor != nil {
			t.Fatalf("floor %s got a ratio", c.Target)
		}
	}
}

// With the sliding log cold, each target's cold cell is followed by both
// paced floors, and each is paced at the target's rate, not at the rate of
// the floor before it.
func TestPlanPacesTheLogScriptFloorAtTheTarget(t *testing.T) {
	cold := matrixScenarios[0]
	for _, sc := range matrixScenarios {
		if sc.cold {
			cold = sc
		}
	}
	m := &matrix{cfg: matrixConfig{Scenarios: []matrixScenario{cold}, Vias: []string{"grpc"}, Clients: []int{16},
		Floors: true, ColdAlgorithm: "sliding_window_log", Targets: []matrixTarget{{Name: "q"}}},
		targets: []*server{{name: "q"}}}
	var names []string
	for _, c := range m.plan() {
		names = append(names, c.name())
	}
	want := "[redis-floor log-floor log-script-floor q redis-floor@q log-script-floor@q]"
	if fmt.Sprint(names) != want {
		t.Fatalf("cells %v, want %s", names, want)
	}
	cells := m.plan()
	done := []cellResult{
		{Scenario: cold.name, Via: "grpc", Clients: 16, Target: "q", ChecksPerSecond: 1000},
		{Scenario: cold.name, Via: "grpc", Clients: 16, Target: "redis-floor@q", ChecksPerSecond: 1500},
	}
	if r := targetRate(done, cells[5]); r != 1000 {
		t.Fatalf("log-script-floor@q paced at %v/s, want the target's 1000", r)
	}
	if r := targetRate(done[1:], cells[5]); r != 0 {
		t.Fatalf("paced at %v/s with no cell of its target", r)
	}
	// In a later round, at the target's rate in that round.
	later := cells[5]
	later.round = 2
	done = append(done, cellResult{Scenario: cold.name, Via: "grpc", Clients: 16, Target: "q", ChecksPerSecond: 800, Round: 2},
		cellResult{Scenario: cold.name, Via: "grpc", Clients: 16, Target: "redis-floor@q", ChecksPerSecond: 900, Round: 2})
	if r := targetRate(done, later); r != 800 {
		t.Fatalf("round 2's log-script-floor@q paced at %v/s, want its round's 800", r)
	}
}

func TestMatrixFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "-quotad or -addr"},
		{[]string{"-quotad", "a=/x", "-quotad", "a=/y"}, "-quotad"},
		{[]string{"-quotad", "grpc-floor=/x"}, "-quotad"},
		{[]string{"-quotad", "/x", "-addr", "127.0.0.1:1"}, "-addr"},
		{[]string{"-addr", "127.0.0.1:1"}, "-redis"},
		{[]string{"-addr", "10.0.0.1:80", "-redis", "127.0.0.1:6379"}, "loopback"},
		{[]string{"-quotad", "/x", "-redis", "example.com:6379"}, "loopback"},
		{[]string{"-quotad", "/x", "-pid", "5"}, "-pid"},
		{[]string{"-quotad", "/x", "-scenarios", "hot"}, "-scenarios"},
		{[]string{"-quotad", "/x", "-via", "http"}, "-via"},
		{[]string{"-quotad", "/x", "-clients", "0"}, "-clients"},
		{[]string{"-quotad", "/x", "-clients", "1,300"}, "-clients"},
		{[]string{"-quotad", "/x", "-duration", "2m"}, "-duration"},
		{[]string{"-quotad", "/x", "-warmup", "-1s"}, "-warmup"},
		{[]string{"-quotad", "/x", "-batch", "1"}, "-batch"},
		{[]string{"-quotad", "/x", "-nkeys", "1"}, "-nkeys"},
		{[]string{"-quotad", "/x", "-rounds", "0"}, "-rounds"},
		{[]string{"-quotad", "/x", "-rounds", "11"}, "-rounds"},
		{[]string{"-quotad", "a", "-quotad", "b", "-quotad", "c", "-quotad", "d", "-quotad", "e"}, "at most 4"},
		{[]string{"-quotad", "/x", "stray"}, "stray"},
		{[]string{"-ratelimit", "/r"}, "-quotad or -addr"},
		{[]string{"-quotad", "/x", "-ratelimit", "x=/r"}, "-ratelimit"},
		{[]string{"-quotad", "/x", "-ratelimit", "/r", "-ratelimit", "/s"}, "-ratelimit"},
		{[]string{"-quotad", "/x", "-ratelimit", "/r", "-ratelimit-env", "NOVALUE"}, "-ratelimit-env"},
		{[]string{"-quotad", "a", "-quotad", "b", "-quotad", "c", "-quotad", "d", "-ratelimit", "/r"}, "at most 4"},
	} {
		err := run(context.Background(), append([]string{"matrix"}, c.args...), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("matrix %q: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}

// runMatrixJSON runs `quotabench matrix` with args and -json, and returns
// the decoded run and the text output.
func runMatrixJSON(t *testing.T, args ...string) (*matrixRun, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run.json")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), append(append([]string{"matrix"}, args...), "-json", path), &stdout, &stderr); err != nil {
		t.Fatalf("matrix: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	r, err := readRun(path)
	if err != nil {
		t.Fatal(err)
	}
	return r, stdout.String()
}

// cellOf returns the one cell of r with these coordinates.
func cellOf(t *testing.T, r *matrixRun, scenario, via string, clients int, target string) cellResult {
	t.Helper()
	for _, c := range r.Cells {
		if c.Scenario == scenario && c.Via == via && c.Clients == clients && c.Target == target {
			return c
		}
	}
	t.Fatalf("no cell %s %s c=%d %s among %d", scenario, via, clients, target, len(r.Cells))
	return cellResult{}
}

// A short matrix on a real quotad and redis-server: every cell answers
// without errors, is decided where its scenario says, and carries CPU,
// syscall and Redis figures and ratios to floors measured in the run.
// Nothing here asserts a speed.
func TestMatrixEndToEnd(t *testing.T) {
	bin := quotadtest.Binary(t)
	r, text := runMatrixJSON(t, "-quotad", "q="+bin, "-redis-server", redistest.Binary(t),
		"-scenarios", "hot-allowed,hot-denied,cold,batch", "-via", "grpc,rls", "-clients", "2",
		"-duration", "300ms", "-warmup", "100ms", "-max-calls", "300", "-nkeys", "1000", "-batch", "10")
	// 4 scenarios × 2 transports × 1 client count × 1 target, 2 gRPC
	// floors (hot-allowed), 1 Redis floor (cold) and 2 Redis floors paced
	// at the target's cold cells.
	if len(r.Cells) != 8+2+1+2 {
		t.Fatalf("%d cells, want 13:\n%s", len(r.Cells), text)
	}
	for _, c := range r.Cells {
		// A node the loaded test machine starves may shed a check as
		// overloaded (Unavailable) rather than decide it late; any other
		// error, or more than a few shed, fails.
		shed := c.ErrorsByCode["Unavailable"]
		if c.Checks == 0 || c.Errors != shed || shed*50 > c.Checks {
			t.Errorf("%s %s %s: %d checks, %d errors (%v, %s)", c.Scenario, c.Via, c.Target, c.Checks, c.Errors, c.ErrorsByCode, c.FirstError)
		}
		if !strings.HasPrefix(c.Target, "redis-floor") && (c.ServerCPUMicros == nil || c.ServerSyscalls == nil) {
			t.Errorf("%s %s %s: no server CPU or syscall figure", c.Scenario, c.Via, c.Target)
		}
	}
	hot := cellOf(t, r, "hot-allowed", "grpc", 2, "q")
	if hot.Denied != 0 || hot.Sources["LEASE"] == 0 || hot.ServerToFloor == nil {
		t.Errorf("hot-allowed: denied %d, sources %v, ratio %v; want all allowed, mostly from leases, a ratio to the floor", hot.Denied, hot.Sources, hot.ServerToFloor)
	}
	if rls := cellOf(t, r, "hot-allowed", "rls", 2, "q"); rls.Denied != 0 || rls.ServerToFloor == nil {
		t.Errorf("hot-allowed over rls: denied %d, ratio %v", rls.Denied, rls.ServerToFloor)
	}
	denied := cellOf(t, r, "hot-denied", "grpc", 2, "q")
	// The one check the limit admits went in the warm-up.
	if denied.Allowed != 0 || denied.Sources["DENIED_CACHE"] == 0 {
		t.Errorf("hot-denied: allowed %d, sources %v; want none allowed and the denied cache answering", denied.Allowed, denied.Sources)
	}
	cold := cellOf(t, r, "cold", "grpc", 2, "q")
	// About one command per check: a fresh write's SET, or a script call
	// and the commands it runs (a few checks take a lease instead).
	if cold.RedisCommands < 0.9 || cold.RedisCPUMicros <= 0 || cold.RedisToFloor == nil || cold.Sources["STORE"] == 0 {
		t.Errorf("cold: %.2f Redis commands and %.1f µs per check, ratio %v, sources %v", cold.RedisCommands, cold.RedisCPUMicros, cold.RedisToFloor, cold.Sources)
	}
	paced := cellOf(t, r, "cold", "grpc", 2, "redis-floor@q")
	if cold.RedisToPacedFloor == nil || paced.RedisCommands < 1.9 || paced.RedisCommands > 2.1 {
		t.Errorf("cold: ratio to the paced floor %v; the paced floor made %.3f commands per operation, want 2", cold.RedisToPacedFloor, paced.RedisCommands)
	}
	// Paced at the target's rate (within a loaded machine's slack), not as
	// fast as Redis answers.
	if paced.ChecksPerSecond > 1.5*cold.ChecksPerSecond {
		t.Errorf("the paced floor sent %.0f/s after a cell of %.0f/s", paced.ChecksPerSecond, cold.ChecksPerSecond)
	}
	floor := cellOf(t, r, "cold", "redis", 2, "redis-floor")
	if floor.RedisCommands < 1.9 || floor.RedisCommands > 2.1 {
		t.Errorf("redis floor: %.3f commands per operation, want 2 (INCRBY, PEXPIRE)", floor.RedisCommands)
	}
	if batch := cellOf(t, r, "batch", "grpc", 2, "q"); batch.Checks != 10*batch.Calls {
		t.Errorf("batch: %d checks in %d calls, want 10 each", batch.Checks, batch.Calls)
	}
	for _, want := range []string{"hot-allowed", "grpc-floor", "redis-floor", "×grpc floor", "load average"} {
		if !strings.Contains(text, want) {
			t.Errorf("text output lacks %q:\n%s", want, text)
		}
	}
	if r.LoadAverageStart == "" || len(r.Targets) != 1 || r.Targets[0].PID == 0 {
		t.Errorf("run header: load %q, targets %+v", r.LoadAverageStart, r.Targets)
	}

	// The same run compared with itself: every ratio is 1.
	path := filepath.Join(t.TempDir(), "run.json")
	if err := writeJSONFile(path, r); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"compare", path, path}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "hot-allowed") || !strings.Contains(out.String(), "1.00") {
		t.Errorf("compare output:\n%s", out.String())
	}
	if err := run(context.Background(), []string{"compare", path}, &out, &bytes.Buffer{}); err == nil {
		t.Error("compare of a one-target file with no -b succeeded")
	}
}

// A running quotad is measured through -addr and -pid, started with the
// config -print-config prints.
func TestMatrixGivenQuotad(t *testing.T) {
	rs := redistest.Start(t)
	var cfg bytes.Buffer
	if err := run(context.Background(), []string{"matrix", "-print-config"}, &cfg, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "matrix.yaml")
	if err := os.WriteFile(path, cfg.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(quotadtest.Binary(t), "--listen", "127.0.0.1:0", "--redis", rs.URL(), "--config", path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatal("quotad printed nothing")
	}
	m := listeningLine.FindStringSubmatch(lines.Text())
	if m == nil {
		t.Fatalf("first line %q", lines.Text())
	}
	go func() {
		for lines.Scan() {
		}
	}()
	r, _ := runMatrixJSON(t, "-addr", m[1], "-pid", strconv.Itoa(cmd.Process.Pid), "-redis", rs.Addr(), "-floors=false",
		"-scenarios", "hot-allowed", "-via", "grpc", "-clients", "1", "-duration", "200ms", "-warmup", "0s", "-max-calls", "100")
	c := cellOf(t, r, "hot-allowed", "grpc", 1, "quotad")
	if c.Errors != 0 || c.Checks == 0 || c.ServerCPUMicros == nil {
		t.Fatalf("cell %+v", c)
	}

	// Two rounds of the cold scenario: each round's cold cell checks keys
	// of its own (a key's first check is a fresh write, a plain SET, where
	// a key the round before wrote would go to the script) and has its
	// ratios to its own round's floors; the medians summarise both.
	r, text := runMatrixJSON(t, "-addr", m[1], "-pid", strconv.Itoa(cmd.Process.Pid), "-redis", rs.Addr(), "-rounds", "2",
		"-scenarios", "cold", "-via", "grpc", "-clients", "1", "-duration", "300ms", "-warmup", "0s", "-max-calls", "50", "-nkeys", "100000")
	var cold []cellResult
	for _, c := range r.Cells {
		if c.Target == "quotad" {
			cold = append(cold, c)
		}
	}
	if len(cold) != 2 || cold[0].Round != 1 || cold[1].Round != 2 {
		t.Fatalf("cold cells %+v, want one in each of rounds 1 and 2", cold)
	}
	for _, c := range cold {
		if c.Errors != 0 || c.Checks == 0 || c.RedisToFloor == nil || c.RedisToPacedFloor == nil {
			t.Fatalf("round %d: %d checks, %d errors, ratios %v and %v", c.Round, c.Checks, c.Errors, c.RedisToFloor, c.RedisToPacedFloor)
		}
		if s := c.RedisCommandsByName["evalsha"]; s > 0.2 {
			t.Errorf("round %d: %.2f script calls per check, want keys of its own, mostly first checks", c.Round, s)
		}
	}
	if len(r.Medians) != 1 || r.Medians[0].Rounds != 2 || r.Medians[0].RedisToFloor == nil ||
		r.Medians[0].RedisToFloor.Min > r.Medians[0].RedisToFloor.Median || r.Medians[0].RedisToFloor.Median > r.Medians[0].RedisToFloor.Max {
		t.Fatalf("medians %+v", r.Medians)
	}
	if !strings.Contains(text, "median over the rounds") {
		t.Errorf("text lacks the medians:\n%s", text)
	}
}

// Each round's cells are compared with that round's floors only.
func TestFillRatiosWithinTheRound(t *testing.T) {
	cells := []cellResult{
		{Round: 1, Scenario: "cold", Via: "redis", Clients: 16, Target: "redis-floor", RedisCPUMicros: 10},
		{Round: 1, Scenario: "cold", Via: "grpc", Clients: 16, Target: "q", RedisCPUMicros: 10},
		{Round: 1, Scenario: "cold", Via: "grpc", Clients: 16, Target: "redis-floor@q", RedisCPUMicros: 20},
		{Round: 2, Scenario: "cold", Via: "redis", Clients: 16, Target: "redis-floor", RedisCPUMicros: 5},
		{Round: 2, Scenario: "cold", Via: "grpc", Clients: 16, Target: "q", RedisCPUMicros: 10},
		{Round: 2, Scenario: "cold", Via: "grpc", Clients: 16, Target: "redis-floor@q", RedisCPUMicros: 40},
	}
	fillRatios(cells)
	for _, c := range []struct {
		i           int
		flat, paced float64
	}{{1, 1, 0.5}, {4, 2, 0.25}} {
		got := cells[c.i]
		if got.RedisToFloor == nil || *got.RedisToFloor != c.flat || got.RedisToPacedFloor == nil || *got.RedisToPacedFloor != c.paced {
			t.Errorf("round %d: ratios %v and %v, want %v and %v", got.Round, got.RedisToFloor, got.RedisToPacedFloor, c.flat, c.paced)
		}
	}
}

// A figure's median over the rounds is the middle value (the mean of the
// middle two for an even count), beside the least and the greatest; the
// floors have none, and neither has a run of one round.
func TestMedianCells(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	var cells []cellResult
	for i, v := range []float64{1.0, 2.0, 1.2} {
		cells = append(cells,
			cellResult{Round: i + 1, Scenario: "cold", Via: "redis", Clients: 16, Target: "redis-floor", RedisCPUMicros: 10},
			cellResult{Round: i + 1, Scenario: "cold", Via: "grpc", Clients: 16, Target: "q", ChecksPerSecond: 100 * v, RedisCPUMicros: 10 * v, RedisToFloor: f(v)})
		if i < 2 {
			cells[len(cells)-1].RedisToPacedFloor = f(v)
		}
	}
	if m := medianCells(cells[:2]); m != nil {
		t.Fatalf("one round: medians %+v, want none", m)
	}
	m := medianCells(cells)
	if len(m) != 1 || m[0].Target != "q" || m[0].Rounds != 3 {
		t.Fatalf("medians %+v, want one of target q over 3 rounds", m)
	}
	if got, want := *m[0].RedisToFloor, (spread{Median: 1.2, Min: 1, Max: 2}); got != want {
		t.Errorf("ratio to the floor %+v, want %+v", got, want)
	}
	if got := *m[0].RedisToPacedFloor; got.Median != 1.5 || got.Min != 1 || got.Max != 2 {
		t.Errorf("ratio to the paced floor over two rounds %+v, want median 1.5", got)
	}
	if m[0].RedisToLogFloor != nil || m[0].ServerCPUMicros != nil {
		t.Errorf("a figure no round measured has a median: %+v %+v", m[0].RedisToLogFloor, m[0].ServerCPUMicros)
	}
}

func TestCompareErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{}, {bad}, {filepath.Join(dir, "missing.json")}, {"a", "b", "c"}} {
		err := run(context.Background(), append([]string{"compare"}, args...), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || errors.Is(err, errHelp) {
			t.Errorf("compare %q: %v, want an error", args, err)
		}
	}
}

// TestLogFloorsKeepALog requires that the sorted-set floors do what they
// stand for on a real Redis: every operation of the pipelined one adds an
// entry; the scripted one adds an entry while its key holds fewer than its
// limit, so the cold scenario's checks, all under it, all add one.
func TestLogFloorsKeepALog(t *testing.T) {
	rs := redistest.Start(t)
	rc, err := redisbench.Dial(rs.Addr(), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	for _, op := range []floorOp{logOp, logScriptOp} {
		prefix := "floor-" + strconv.Itoa(int(op)) + "-"
		o := runRedisFloor(context.Background(), rc, op, prefix, 10, 2, 0, 10*time.Second, 200)
		if o.checks != 200 || o.failed() != 0 {
			t.Fatalf("op %d: %d operations, %d failed (%v), want 200 and none", op, o.checks, o.failed(), o.errors)
		}
		entries := 0
		for k := range 10 {
			n, err := rs.Do("ZCARD", prefix+strconv.Itoa(k))
			if err != nil {
				t.Fatal(err)
			}
			c, _ := strconv.Atoi(n)
			entries += c
		}
		if entries != 200 {
			t.Errorf("op %d: the logs hold %d entries after 200 operations, want 200", op, entries)
		}
	}
	// At the limit the scripted floor adds nothing.
	ctx := context.Background()
	for i := range 3 {
		added, err := rc.LogCheck(ctx, "floor-full", strconv.Itoa(i), time.Now().UnixMilli(), time.Hour, 2)
		if err != nil || added != (i < 2) {
			t.Fatalf("check %d under a limit of 2: added %v, %v", i, added, err)
		}
	}
}

// compare matches a cell with the same round's, and reads a file written
// before rounds (no round) as round 1.
func TestCompareMatchesRounds(t *testing.T) {
	old := &matrixRun{Cells: []cellResult{{Scenario: "cold", Via: "grpc", Clients: 16, Target: "a", ChecksPerSecond: 100}}}
	rounds := &matrixRun{Cells: []cellResult{
		{Round: 1, Scenario: "cold", Via: "grpc", Clients: 16, Target: "b", ChecksPerSecond: 150},
		{Round: 2, Scenario: "cold", Via: "grpc", Clients: 16, Target: "b", ChecksPerSecond: 300},
	}}
	var out bytes.Buffer
	if err := writeComparison(&out, old, "a", rounds, "b"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "100 → 150") || strings.Contains(out.String(), "300") {
		t.Fatalf("an old file against round 1 of a new one:\n%s", out.String())
	}
}
