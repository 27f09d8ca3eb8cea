package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// quotabench matrix: the standard measurement of what a check costs. Every
// scenario runs at every client count over every transport, against every
// target, back to back, after the same warm-up; the gRPC floor (a bare
// grpc-go server) and the Redis floor (INCRBY+PEXPIRE pipelined straight to
// the same Redis; for a sliding log, the sorted-set floor too) are measured
// in the same run, next to the rows they are
// the floor of, so that ratios hold on a machine whose load changes.

// Bounds of the matrix's flags: every run ends by itself.
const (
	maxCellDuration  = time.Minute
	maxMatrixClients = 256
	maxTargets       = 4
	maxRounds        = 10
)

// matrixScenario is one row group of the matrix.
type matrixScenario struct {
	name string
	// policy is the configured policy the checks name; rlsKey the Envoy
	// descriptor entry that the matrix's rules map to it.
	policy, rlsKey string
	// cold: keys drawn from -nkeys distinct keys; else one key.
	cold bool
	// batch: -batch checks per call (CheckBatch, or as many descriptors in
	// one ShouldRateLimit); else one.
	batch bool
	// floor is the floor measured next to it: "grpc", "redis" or "".
	floor string
	about string
}

// The matrix's policies, which a quotad it is given must serve (see
// -print-config). Their limits are far above what a run can spend, except
// qb-denied's, which admits one check a year.
var matrixScenarios = []matrixScenario{
	{name: "hot-allowed", policy: "qb-hot", rlsKey: "hot", floor: "grpc", about: "one key, always allowed: answered from a lease"},
	{name: "hot-denied", policy: "qb-denied", rlsKey: "denied", about: "one key over its limit: answered from the denied cache"},
	{name: "cold", policy: "qb-cold", rlsKey: "cold", cold: true, floor: "redis", about: "keys drawn from -nkeys: nearly every check a Redis call"},
	{name: "lease-off", policy: "qb-lease-off", rlsKey: "lease-off", about: "one key, policy lease: off: every check a Redis script call"},
	{name: "batch", policy: "qb-hot", rlsKey: "hot", batch: true, about: "one key, -batch checks per call (CheckBatch, or descriptors of one ShouldRateLimit)"},
}

// matrixDomain is the Envoy domain of the matrix's rules.
const matrixDomain = "quotabench"

// matrixConfigFor is the quotad config file every target is started with,
// the cold scenario's policy under algorithm cold (-cold-algorithm).
func matrixConfigFor(cold string) string {
	limit := "4000000000"
	if cold == "sliding_window_log" || cold == "sliding_window_counter" {
		// A log keeps an entry per check, and a counter's limit × period
		// must stay exact: a million an hour for both.
		limit = "1000000"
	}
	return strings.Replace(matrixConfigYAML, "  - name: qb-cold\n    algorithm: token_bucket\n    limit: 4000000000\n",
		"  - name: qb-cold\n    algorithm: "+cold+"\n    limit: "+limit+"\n", 1)
}

// matrixConfigYAML is the matrix's config file with the cold scenario's
// policy a token bucket.
const matrixConfigYAML = `# quotabench matrix: the policies and Envoy rules it checks.
policies:
  - name: qb-hot
    algorithm: token_bucket
    limit: 4000000000
    period: 1h
  - name: qb-denied
    algorithm: fixed_window
    limit: 1
    period: 8760h
  - name: qb-cold
    algorithm: token_bucket
    limit: 4000000000
    period: 1h
  - name: qb-lease-off
    algorithm: token_bucket
    limit: 4000000000
    period: 1h
    lease: "off"
envoy:
  domains:
    - domain: quotabench
      descriptors:
        - key: hot
          policy: qb-hot
        - key: denied
          policy: qb-denied
        - key: cold
          policy: qb-cold
        - key: lease-off
          policy: qb-lease-off
`

// Transports (-via).
const (
	viaGRPC = "grpc" // quotad.v1.QuotaService over gRPC
	viaRLS  = "rls"  // Envoy's RateLimitService over gRPC
)

// runMatrix is `quotabench matrix`.
func runMatrix(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, printed, err := parseMatrixConfig(args, stdout)
	if err != nil || printed {
		return err
	}
	m := &matrix{cfg: cfg, log: stderr}
	defer m.close()
	if err := m.start(ctx); err != nil {
		return err
	}
	run := m.run(ctx)
	run.Args = append([]string{"matrix"}, args...)
	fillRatios(run.Cells)
	run.Medians = medianCells(run.Cells)
	if err := writeMatrixText(stdout, run); err != nil {
		return err
	}
	if cfg.JSONPath != "" {
		if err := writeJSONFile(cfg.JSONPath, run); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// matrix holds a run's processes.
type matrix struct {
	cfg     matrixConfig
	log     io.Writer
	redis   *redisServer
	floor   *server
	targets []*server
	config  string // the quotad config file
	tmp     string
}

func (m *matrix) start(ctx context.Context) error {
	var err error
	if m.cfg.Redis != "" {
		m.redis, err = useRedis(ctx, m.cfg.Redis)
	} else {
		m.redis, err = startRedis(ctx, m.cfg.RedisServer)
	}
	if err != nil {
		return err
	}
	if m.cfg.Floors {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("the gRPC floor re-runs quotabench: %w", err)
		}
		if m.floor, err = startServer("grpc-floor", self, []string{floorCommand}); err != nil {
			return err
		}
	}
	if m.tmp, err = os.MkdirTemp("", "quotabench-matrix-"); err != nil {
		return err
	}
	m.config = filepath.Join(m.tmp, "matrix.yaml")
	if err := os.WriteFile(m.config, []byte(matrixConfigFor(m.cfg.ColdAlgorithm)), 0o644); err != nil {
		return err
	}
	for i, t := range m.cfg.Targets {
		var s *server
		switch {
		case t.Kind == peerRatelimit:
			s, err = startRatelimit(t.Name, t.Binary, m.redis.addr, m.tmp, m.cfg.PeerEnv)
		case t.Binary == "":
			s = &server{name: t.Name, addr: t.Addr, pid: t.PID}
			err = s.dial()
		default:
			// Each target on a database of its own: one's keys are never
			// another's state.
			args := append([]string{"--listen", "127.0.0.1:0", "--redis", m.redis.url(i), "--config", m.config, "--log-level", "warn"}, m.cfg.QuotadArgs...)
			s, err = startServer(t.Name, t.Binary, args)
		}
		if err != nil {
			return err
		}
		m.targets = append(m.targets, s)
	}
	return nil
}

func (m *matrix) close() {
	for _, s := range m.targets {
		s.stop()
	}
	if m.floor != nil {
		m.floor.stop()
	}
	if m.redis != nil {
		m.redis.stop()
	}
	if m.tmp != "" {
		os.RemoveAll(m.tmp)
	}
}

// cell is one measurement to make.
type cell struct {
	sc      matrixScenario
	via     string
	clients int
	// exactly one of: a gRPC server (floor or target), or a Redis floor
	// sending op.
	srv        *server
	redisFloor bool
	op         floorOp
	// pacedAfter, on a Redis floor, names the target whose cell runs just
	// before it: the floor then sends at that cell's checks/s (rate, set
	// when the cell runs) instead of as fast as it can.
	pacedAfter string
	rate       float64
	// round is which pass over the plan the cell is in, from 1.
	round int
}

// logFloorName and logScriptFloorName are the sorted-set floors' target
// names: a sliding log kept as the common recipe keeps it
// (ZREMRANGEBYSCORE, ZADD, ZCARD and PEXPIRE), pipelined (logOp: what the
// commands alone cost) and in one script call (logScriptOp: the same made
// exact). They are measured flat out beside the counter's floor when the
// cold scenario's algorithm is the sliding log.
const (
	logFloorName       = "log-floor"
	logScriptFloorName = "log-script-floor"
)

// pacedFloorPrefix starts the name of a Redis floor paced at a target's
// rate: "redis-floor@after"; pacedLogScriptFloorPrefix, the scripted
// sorted-set floor's, "log-script-floor@after".
const (
	pacedFloorPrefix          = "redis-floor@"
	pacedLogScriptFloorPrefix = logScriptFloorName + "@"
)

// plan lists the cells in the order they run: per scenario, transport and
// client count, the floor first and then each target.
func (m *matrix) plan() []cell {
	var cells []cell
	for _, sc := range m.cfg.Scenarios {
		for vi, via := range m.cfg.Vias {
			for _, c := range m.cfg.Clients {
				if m.floor != nil && sc.floor == "grpc" {
					cells = append(cells, cell{sc: sc, via: via, clients: c, srv: m.floor})
				}
				if m.cfg.Floors && sc.floor == "redis" && vi == 0 {
					cells = append(cells, cell{sc: sc, via: via, clients: c, redisFloor: true})
					if m.cfg.ColdAlgorithm == algorithms.SlidingWindowLog.String() {
						cells = append(cells, cell{sc: sc, via: via, clients: c, redisFloor: true, op: logOp},
							cell{sc: sc, via: via, clients: c, redisFloor: true, op: logScriptOp})
					}
				}
				for i, t := range m.targets {
					if m.cfg.Targets[i].Kind == peerRatelimit && via != viaRLS {
						continue // envoyproxy/ratelimit speaks rls only
					}
					cells = append(cells, cell{sc: sc, via: via, clients: c, srv: t})
					if m.cfg.Floors && sc.floor == "redis" {
						cells = append(cells, cell{sc: sc, via: via, clients: c, redisFloor: true, pacedAfter: t.name})
						if m.cfg.ColdAlgorithm == algorithms.SlidingWindowLog.String() {
							cells = append(cells, cell{sc: sc, via: via, clients: c, redisFloor: true, op: logScriptOp, pacedAfter: t.name})
						}
					}
				}
			}
		}
	}
	return cells
}

func (m *matrix) run(ctx context.Context) *matrixRun {
	host, _ := os.Hostname()
	run := &matrixRun{
		Started: time.Now().UTC(), Host: host, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
		LoadAverageStart: loadAverage(), Redis: "redis-server " + m.redis.version + " at " + m.redis.addr,
		Duration: m.cfg.Duration.String(), Warmup: m.cfg.Warmup.String(),
	}
	for i, t := range m.cfg.Targets {
		t.Addr = m.targets[i].addr
		t.PID = m.targets[i].pid
		run.Targets = append(run.Targets, t)
	}
	// Each round is the whole plan again: a cell is compared with the
	// floors of its own round, measured beside it.
	plan := m.plan()
	var cells []cell
	for round := 1; round <= m.cfg.Rounds; round++ {
		for _, c := range plan {
			c.round = round
			cells = append(cells, c)
		}
	}
	fmt.Fprintf(m.log, "quotabench matrix: %d cells of %s + %s warm-up (about %s); load average %s\n",
		len(cells), m.cfg.Duration, m.cfg.Warmup, (time.Duration(len(cells)) * (m.cfg.Duration + m.cfg.Warmup)).Round(time.Second), run.LoadAverageStart)
	for i, c := range cells {
		if ctx.Err() != nil {
			break
		}
		if c.pacedAfter != "" {
			c.rate = targetRate(run.Cells, c)
			if c.rate <= 0 {
				// Flat out it would be the other floor under this one's name.
				fmt.Fprintf(m.log, "[%d/%d] %s %s c=%d %s: skipped, its target made no checks\n",
					i+1, len(cells), c.sc.name, c.via, c.clients, c.name())
				continue
			}
		}
		r := m.measure(ctx, c)
		run.Cells = append(run.Cells, r)
		fmt.Fprintf(m.log, "[%d/%d] %-11s %-4s c=%-3d %-12s %9.0f checks/s  p99 %s  errors %d\n",
			i+1, len(cells), r.Scenario, r.Via, r.Clients, r.Target, r.ChecksPerSecond, fmtMillis(r.Latency.P99), r.Errors)
	}
	run.LoadAverageEnd = loadAverage()
	return run
}

// targetRate is the checks/s of the target cell a paced floor c follows:
// the latest measured cell of that target in c's scenario, transport,
// client count and round (0 if none).
func targetRate(done []cellResult, c cell) float64 {
	for i := len(done) - 1; i >= 0; i-- {
		r := done[i]
		if r.Target == c.pacedAfter && r.Scenario == c.sc.name && r.Via == c.via && r.Clients == c.clients && r.Round == c.round {
			return r.ChecksPerSecond
		}
	}
	return 0
}

// name is the cell's target name in the results.
func (c cell) name() string {
	switch {
	case c.srv != nil:
		return c.srv.name
	case c.op == logScriptOp && c.pacedAfter != "":
		return pacedLogScriptFloorPrefix + c.pacedAfter
	case c.op == logOp:
		return logFloorName
	case c.op == logScriptOp:
		return logScriptFloorName
	case c.pacedAfter != "":
		return pacedFloorPrefix + c.pacedAfter
	}
	return "redis-floor"
}

// measure runs one cell: the warm-up, readings, the measured load,
// readings again.
func (m *matrix) measure(ctx context.Context, c cell) cellResult {
	name := c.name()
	// Keys of their own per cell and round: nothing carries over from
	// another cell.
	prefix := fmt.Sprintf("%s-%s-%d-%s-%d-", c.sc.name, c.via, c.clients, name, c.round)
	load := func(d time.Duration) callOutcome {
		if c.redisFloor {
			return runRedisFloor(ctx, m.redis.client, c.op, "qb-floor-"+prefix, m.cfg.NKeys, c.clients, c.rate, d, m.cfg.MaxCalls)
		}
		return runCalls(ctx, c.srv.conn, m.workload(c, prefix), c.clients, d, m.cfg.MaxCalls, m.cfg.Timeout)
	}
	if m.cfg.Warmup > 0 {
		load(m.cfg.Warmup)
	}
	b := m.sample(ctx, c)
	o := load(m.cfg.Duration)
	a := m.sample(ctx, c)
	return m.result(c, name, o, b, a)
}

// workload is what cell c sends.
func (m *matrix) workload(c cell, prefix string) workload {
	nkeys, items := 1, 1
	if c.sc.cold {
		nkeys = m.cfg.NKeys
	}
	if c.sc.batch {
		items = m.cfg.Batch
	}
	if c.via == viaRLS {
		return rlsWorkload(matrixDomain, c.sc.rlsKey, prefix, nkeys, items)
	}
	return checkWorkload(c.sc.policy, prefix, nkeys, items)
}

// sample is one set of readings around a cell.
type sample struct {
	server, self procSample
	serverOK     bool
	redisCPU     time.Duration
	commands     commandStats
	ownInfos     int64
	err          error
}

func (m *matrix) sample(ctx context.Context, c cell) sample {
	var s sample
	if c.srv != nil && c.srv.pid != 0 {
		var err error
		s.server, err = readProc(c.srv.pid)
		s.serverOK = err == nil
	}
	s.self, _ = readProc(0)
	// Redis counts an INFO call in the next reading; the readings of one
	// sample are commandstats, then cpu.
	s.ownInfos = m.redis.stats.infos
	s.commands, s.err = m.redis.stats.read(ctx)
	if s.err == nil {
		s.redisCPU, s.err = m.redis.stats.cpu(ctx)
	}
	return s
}

func (m *matrix) result(c cell, name string, o callOutcome, b, a sample) cellResult {
	r := cellResult{
		Scenario: c.sc.name, Via: c.via, Clients: c.clients, Target: name, Round: c.round,
		Calls: o.calls, Checks: o.checks, Allowed: o.allowed, Denied: o.denied, Errors: o.failed(),
		ElapsedSeconds: o.elapsed.Seconds(), FirstError: o.firstErrorDetail,
		Latency: latencyReport{
			P50: millis(o.latency.quantile(0.50)), P90: millis(o.latency.quantile(0.90)),
			P99: millis(o.latency.quantile(0.99)), P999: millis(o.latency.quantile(0.999)), Max: millis(o.latency.max),
		},
		LoadAverage: loadAverage(),
	}
	if c.redisFloor && c.pacedAfter == "" {
		r.Via = "redis"
	}
	if len(o.errors) > 0 {
		r.ErrorsByCode = o.errors
	}
	for i, n := range o.sources {
		if n > 0 {
			if r.Sources == nil {
				r.Sources = map[string]int64{}
			}
			r.Sources[sourceName(i)] = n
		}
	}
	if o.elapsed > 0 {
		r.ChecksPerSecond = float64(o.checks) / o.elapsed.Seconds()
	}
	if o.checks == 0 {
		return r
	}
	per := func(v float64) float64 { return v / float64(o.checks) }
	if b.serverOK && a.serverOK {
		cpu := per(float64(a.server.CPU-b.server.CPU) / float64(time.Microsecond))
		r.ServerCPUMicros = &cpu
		if a.server.Syscalls >= 0 && b.server.Syscalls >= 0 {
			sys := per(float64(a.server.Syscalls - b.server.Syscalls))
			r.ServerSyscalls = &sys
		}
	}
	r.ClientCPUMicros = per(float64(a.self.CPU-b.self.CPU) / float64(time.Microsecond))
	if a.err == nil && b.err == nil {
		r.RedisCPUMicros = per(float64(a.redisCPU-b.redisCPU) / float64(time.Microsecond))
		d := diffStats(b.commands, a.commands, a.ownInfos-b.ownInfos, o.checks, o.allowed)
		r.RedisCommands = d.CommandsPerCheck
		r.RedisCommandsByName = make(map[string]float64, len(d.ByCommand))
		for name, n := range d.ByCommand {
			r.RedisCommandsByName[name] = per(float64(n))
		}
	}
	return r
}
