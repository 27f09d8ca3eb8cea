package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// This file is quotabench matrix's flags: matrixConfig, parsed and
// validated, and the usage text.

// matrixTarget is a quotad to measure: started from a binary, or given.
type matrixTarget struct {
	Name string `json:"name"`
	// Binary is the quotad started; empty for a given one.
	Binary string `json:"binary,omitempty"`
	// Addr and PID of a given quotad.
	Addr string `json:"addr,omitempty"`
	PID  int    `json:"pid,omitempty"`
	// Kind is "" for quotad, peerRatelimit for envoyproxy/ratelimit (a
	// peer, measured over rls only).
	Kind string `json:"kind,omitempty"`
}

// matrixConfig is a matrix run, parsed and validated.
type matrixConfig struct {
	// ColdAlgorithm is the cold scenario's policy's algorithm.
	ColdAlgorithm string
	Targets       []matrixTarget
	QuotadArgs    []string
	PeerEnv       []string // extra KEY=VALUE for envoyproxy/ratelimit peers
	RedisServer   string   // binary to start; "" when Redis is given
	Redis         string   // given Redis host:port
	Scenarios     []matrixScenario
	Vias          []string
	Clients       []int
	Duration      time.Duration
	Warmup        time.Duration
	MaxCalls      int64
	Timeout       time.Duration
	NKeys         int
	Batch         int
	Floors        bool
	JSONPath      string
	// Rounds is how many times the whole plan runs, each round on keys of
	// its own and with ratios to its own floors.
	Rounds int
}

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, " ") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

func parseMatrixConfig(args []string, stdout io.Writer) (matrixConfig, bool, error) {
	fs := flag.NewFlagSet("quotabench matrix", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var quotads, quotadArgs, ratelimits, ratelimitEnv repeated
	fs.Var(&quotads, "quotad", "a quotad `[name=]binary` to start and measure; repeat to compare builds in one run (at most 4). Name defaults to the file name")
	fs.Var(&quotadArgs, "quotad-arg", "an extra `flag` for every started quotad, e.g. -quotad-arg=--pprof-addr=127.0.0.1:6060; repeatable")
	fs.Var(&ratelimits, "ratelimit", "an envoyproxy/ratelimit `[name=]binary` (its src/service_cmd) to start on the same Redis and measure beside the quotad targets, over rls only; name defaults to ratelimit")
	fs.Var(&ratelimitEnv, "ratelimit-env", "an extra `KEY=VALUE` of envoyproxy/ratelimit's environment for every -ratelimit, e.g. LOCAL_CACHE_SIZE_IN_BYTES=1048576; repeatable")
	addr := fs.String("addr", "", "a running quotad's gRPC `host:port` on loopback, instead of -quotad; start it with -print-config's file on the Redis of -redis")
	pid := fs.Int("pid", 0, "with -addr: the quotad's process id, whose /proc figures are its CPU and syscalls")
	redisServer := fs.String("redis-server", "redis-server", "redis-server `binary` to start on a free loopback port for the run")
	redisAddr := fs.String("redis", "", "use this Redis (`host:port` on loopback) instead of starting one; nothing else should use it during the run")
	scenarios := fs.String("scenarios", "hot-allowed,hot-denied,cold,lease-off,batch", "scenarios to run, comma-separated")
	vias := fs.String("via", "grpc,rls", "transports: grpc (quotad.v1.QuotaService) and rls (Envoy's RateLimitService), comma-separated")
	clients := fs.String("clients", "1,16", fmt.Sprintf("client counts, comma-separated, each 1 to %d; each client has one call in flight", maxMatrixClients))
	duration := fs.Duration("duration", 5*time.Second, "measured time per cell, at most "+maxCellDuration.String())
	warmup := fs.Duration("warmup", time.Second, "unmeasured load before each cell, at most "+maxCellDuration.String())
	maxCalls := fs.Int64("max-calls", 0, "stop a cell after this many calls if sooner than -duration; 0 means no cap")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of each call")
	nkeys := fs.Int("nkeys", 100_000, "distinct keys of the cold scenario and the Redis floor")
	batch := fs.Int("batch", 100, "checks per call in the batch scenario, 2 to 1000")
	floors := fs.Bool("floors", true, "measure the gRPC and Redis floors")
	rounds := fs.Int("rounds", 1, fmt.Sprintf("run every cell this many times, one round after another, 1 to %d; the text adds each target cell's median over the rounds", maxRounds))
	jsonPath := fs.String("json", "", "also write the results to this `file` as JSON (for quotabench compare)")
	printConfig := fs.Bool("print-config", false, "print the quotad config file the matrix uses and exit")
	coldAlgorithm := fs.String("cold-algorithm", "token_bucket", "the `algorithm` of the cold scenario's policy: fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket or gcra")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			matrixUsage(fs, stdout)
			return matrixConfig{}, false, errHelp
		}
		return matrixConfig{}, false, fmt.Errorf("%w (see quotabench matrix -help)", err)
	}
	if _, err := algorithms.ParseAlgorithm(*coldAlgorithm); err != nil || *coldAlgorithm == "concurrency" {
		return matrixConfig{}, false, fmt.Errorf("-cold-algorithm: %q is not one of fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra", *coldAlgorithm)
	}
	if *printConfig {
		_, err := io.WriteString(stdout, matrixConfigFor(*coldAlgorithm))
		return matrixConfig{}, true, err
	}
	if fs.NArg() > 0 {
		return matrixConfig{}, false, fmt.Errorf("unexpected argument %q (see quotabench matrix -help)", fs.Arg(0))
	}
	c := matrixConfig{ColdAlgorithm: *coldAlgorithm, QuotadArgs: quotadArgs, PeerEnv: ratelimitEnv, Duration: *duration, Warmup: *warmup, MaxCalls: *maxCalls,
		Timeout: *timeout, NKeys: *nkeys, Batch: *batch, Floors: *floors, JSONPath: *jsonPath, Rounds: *rounds}
	names := map[string]bool{"grpc-floor": true, "redis-floor": true, logFloorName: true, logScriptFloorName: true}
	for _, q := range quotads {
		name, bin, ok := strings.Cut(q, "=")
		if !ok {
			name, bin = filepath.Base(q), q
		}
		if name == "" || bin == "" || names[name] {
			return matrixConfig{}, false, fmt.Errorf("-quotad %q: want [name=]binary with a name of its own", q)
		}
		names[name] = true
		c.Targets = append(c.Targets, matrixTarget{Name: name, Binary: bin})
	}
	switch {
	case *addr != "" && len(c.Targets) > 0:
		return matrixConfig{}, false, errors.New("-addr: measure started binaries (-quotad) or one running quotad (-addr), not both")
	case *addr != "":
		if err := checkLoopback(*addr); err != nil {
			return matrixConfig{}, false, fmt.Errorf("-addr: %w", err)
		}
		if *redisAddr == "" {
			return matrixConfig{}, false, errors.New("-addr: also give -redis, the Redis that quotad uses")
		}
		c.Targets = []matrixTarget{{Name: "quotad", Addr: *addr, PID: *pid}}
	case len(c.Targets) == 0:
		return matrixConfig{}, false, errors.New("-quotad or -addr: say which quotad to measure")
	case *pid != 0:
		return matrixConfig{}, false, errors.New("-pid: only with -addr (started binaries are measured by their own pid)")
	}
	for _, r := range ratelimits {
		name, bin, ok := strings.Cut(r, "=")
		if !ok {
			name, bin = "ratelimit", r
		}
		if name == "" || bin == "" || names[name] {
			return matrixConfig{}, false, fmt.Errorf("-ratelimit %q: want [name=]binary with a name of its own", r)
		}
		names[name] = true
		c.Targets = append(c.Targets, matrixTarget{Name: name, Binary: bin, Kind: peerRatelimit})
	}
	for _, e := range ratelimitEnv {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return matrixConfig{}, false, fmt.Errorf("-ratelimit-env %q: want KEY=VALUE", e)
		}
	}
	if len(c.Targets) > maxTargets {
		return matrixConfig{}, false, fmt.Errorf("-quotad and -ratelimit: %d targets, at most %d", len(c.Targets), maxTargets)
	}
	if *redisAddr != "" {
		if err := checkLoopback(*redisAddr); err != nil {
			return matrixConfig{}, false, fmt.Errorf("-redis: %w", err)
		}
		c.Redis = *redisAddr
	} else {
		c.RedisServer = *redisServer
	}
	for name := range strings.SplitSeq(*scenarios, ",") {
		i := slices.IndexFunc(matrixScenarios, func(s matrixScenario) bool { return s.name == strings.TrimSpace(name) })
		if i < 0 {
			return matrixConfig{}, false, fmt.Errorf("-scenarios: %q is not one of hot-allowed, hot-denied, cold, lease-off, batch", name)
		}
		c.Scenarios = append(c.Scenarios, matrixScenarios[i])
	}
	for v := range strings.SplitSeq(*vias, ",") {
		v = strings.TrimSpace(v)
		if v != viaGRPC && v != viaRLS {
			return matrixConfig{}, false, fmt.Errorf("-via: %q is not grpc or rls", v)
		}
		c.Vias = append(c.Vias, v)
	}
	for s := range strings.SplitSeq(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > maxMatrixClients {
			return matrixConfig{}, false, fmt.Errorf("-clients: %q must be 1 to %d", s, maxMatrixClients)
		}
		c.Clients = append(c.Clients, n)
	}
	switch {
	case c.Duration <= 0 || c.Duration > maxCellDuration:
		return matrixConfig{}, false, fmt.Errorf("-duration: %s must be > 0 and at most %s", c.Duration, maxCellDuration)
	case c.Warmup < 0 || c.Warmup > maxCellDuration:
		return matrixConfig{}, false, fmt.Errorf("-warmup: %s must be 0 to %s", c.Warmup, maxCellDuration)
	case c.MaxCalls < 0:
		return matrixConfig{}, false, fmt.Errorf("-max-calls: %d must be >= 0", c.MaxCalls)
	case c.Timeout <= 0 || c.Timeout > maxTimeout:
		return matrixConfig{}, false, fmt.Errorf("-timeout: %s must be > 0 and at most %s", c.Timeout, maxTimeout)
	case c.NKeys < 2 || c.NKeys > maxKeys:
		return matrixConfig{}, false, fmt.Errorf("-nkeys: %d must be 2 to %d", c.NKeys, maxKeys)
	case c.Batch < 2 || c.Batch > 1000:
		return matrixConfig{}, false, fmt.Errorf("-batch: %d must be 2 to 1000", c.Batch)
	case c.Rounds < 1 || c.Rounds > maxRounds:
		return matrixConfig{}, false, fmt.Errorf("-rounds: %d must be 1 to %d", c.Rounds, maxRounds)
	}
	return c, false, nil
}

func matrixUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, `quotabench matrix — what a check costs, against floors measured in the same run.

Starts a redis-server, the gRPC floor (a bare grpc-go server returning a
constant answer, as a process of its own) and each -quotad binary on loopback,
then for every scenario, transport and client count measures each target back
to back: checks/s, p50/p99 per call, server CPU µs and read/write syscalls per
check (/proc/<pid>/stat and /io), Redis CPU µs and commands per check (INFO cpu
and commandstats), and the load generator's own CPU. Ratios: server CPU to the
gRPC floor's (same transport and clients), Redis CPU to INCRBY+PEXPIRE's; with
-cold-algorithm sliding_window_log, also to a sorted-set log's, pipelined and
in one script call, and to the scripted one's sent at the target's checks/s.

Usage:
  quotabench matrix -quotad before=/tmp/quotad-main -quotad after=./quotad [flags]
  quotabench matrix -quotad ./quotad -ratelimit ./ratelimit [flags]   (beside envoyproxy/ratelimit)
  quotabench matrix -addr 127.0.0.1:8080 -pid PID -redis 127.0.0.1:6390 [flags]
  quotabench matrix -print-config > matrix.yaml   (the config a given quotad needs)
  quotabench compare [-a NAME -b NAME] run.json [after.json]

Scenarios:
`)
	for _, s := range matrixScenarios {
		fmt.Fprintf(w, "  %-12s %s\n", s.name, s.about)
	}
	fmt.Fprint(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprint(w, `
Run it on an otherwise quiet machine: every process shares the CPUs, so the
ratios measured in one run are the figures to trust, not the absolute ones.
With -rounds N the whole plan runs N times, each round on keys of its own and
compared with its own floors; the medians over the rounds move least with a
busy neighbour.
`)
}
