package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redisbench"
	"github.com/quotad/quotad/node"
)

// errHelp means -help was asked for and printed; main exits 0.
var errHelp = errors.New("help requested")

// Bounds of the flags. They keep every run finite and its memory bounded.
const (
	// maxDuration bounds -duration so that a run always stops by itself.
	maxDuration = 10 * time.Minute
	// maxTimeout bounds -timeout, the longest a single check may take.
	maxTimeout = time.Minute
	// maxClients bounds -clients; each client holds a ~15 KiB latency
	// histogram and a goroutine.
	maxClients = 10000
	// maxKeys bounds -nkeys.
	maxKeys = 10_000_000
)

// Key distributions (-keys).
const (
	keysUniform = "uniform"
	keysZipf    = "zipf"
	keysSingle  = "single"
)

// Protocols (-protocol).
const (
	protocolConnect = "connect"
	protocolGRPC    = "grpc"
)

// config is one benchmark run, parsed and validated from the flags.
type config struct {
	// Addr is quotad's base URL, http:// only. Default http://127.0.0.1:8080.
	Addr string
	// Protocol is "connect" (binary Connect over HTTP/1.1) or "grpc" (gRPC
	// over cleartext HTTP/2). Default grpc.
	Protocol string
	// Clients is the number of concurrent workers, each with at most one
	// check in flight. Default 16.
	Clients int
	// Duration is how long workers start new checks; > 0 and ≤ 10m.
	// Default 10s.
	Duration time.Duration
	// Requests caps the number of checks sent; 0 means no cap.
	Requests int64
	// Timeout bounds each check. Default 5s.
	Timeout time.Duration
	// Gzip makes the client advertise gzip response compression, as
	// connect-go clients do by default. Default false.
	Gzip bool

	// Policy is the configured policy to check, or with Inline the
	// namespace of the inline limit. Default "bench" (inline only).
	Policy string
	// Inline is the limit sent with every check; nil checks the configured
	// policy Policy.
	Inline *algorithms.Limit
	// Fail is the inline limit's failure mode: "", "open" or "closed".
	Fail string
	// Cost is the units each check spends, ≥ 0. Default 1.
	Cost int64

	// Keys is the key distribution: uniform, zipf or single. Default uniform.
	Keys string
	// NKeys is the number of distinct keys, KeyPrefix+"0" to
	// KeyPrefix+strconv.Itoa(NKeys-1). Default 1000; 1 for single.
	NKeys int
	// ZipfS is the Zipf exponent, > 1. Default 1.1.
	ZipfS float64
	// Seed seeds the per-client random sources. Default 1.
	Seed uint64
	// KeyPrefix starts every key. Default "k".
	KeyPrefix string

	// Redis is the Redis quotad uses, as host:port or a redis:// URL; empty
	// means no Redis figures.
	Redis string
	// JSON prints the report as one JSON object.
	JSON bool
}

// rawFlags are the flags as typed, before validation.
type rawFlags struct {
	addr, protocol             string
	clients                    int
	duration, timeout          time.Duration
	requests                   int64
	gzip                       bool
	policy, algorithm, fail    string
	limit, burst, cost         int64
	period                     time.Duration
	keys, keyPrefix, redisAddr string
	nkeys                      int
	zipfS                      float64
	seed                       uint64
	json                       bool
}

func newFlagSet(f *rawFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("quotabench", flag.ContinueOnError)
	// Parse errors come back as errors and are printed once, by main; usage
	// is printed only for -help.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}

	fs.StringVar(&f.addr, "addr", "http://127.0.0.1:8080", "quotad's base `URL`; http:// only (cleartext). Checks go to this address and nowhere else")
	fs.StringVar(&f.protocol, "protocol", protocolGRPC, "connect (binary Connect over HTTP/1.1) or grpc (gRPC over cleartext HTTP/2, one multiplexed connection)")
	fs.IntVar(&f.clients, "clients", 16, fmt.Sprintf("concurrent clients, each with one check in flight; 1 to %d", maxClients))
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long clients start new checks; > 0 and at most "+maxDuration.String()+". Checks in flight at the end finish and are counted")
	fs.Int64Var(&f.requests, "requests", 0, "stop after this many checks in total, if sooner than -duration; 0 means no cap")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "deadline of each check; > 0 and at most "+maxTimeout.String())
	fs.BoolVar(&f.gzip, "gzip", false, "advertise gzip response compression, as connect-go clients do by default (off: the figures measure quotad, not gzip)")

	fs.StringVar(&f.policy, "policy", "bench", "a configured policy `name`, or with -algorithm the namespace of the inline limit")
	fs.StringVar(&f.algorithm, "algorithm", "", "send an inline limit: fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket or gcra (needs -limit and -period)")
	fs.Int64Var(&f.limit, "limit", 0, "inline limit: units per -period, > 0")
	fs.DurationVar(&f.period, "period", 0, "inline limit: the period, whole milliseconds from 1ms to 8760h")
	fs.Int64Var(&f.burst, "burst", 0, "inline limit: capacity of token_bucket, leaky_bucket and gcra; 0 means -limit")
	fs.StringVar(&f.fail, "fail", "", "inline limit: open or closed, what quotad does when its store fails; empty means the server's default")
	fs.Int64Var(&f.cost, "cost", 1, "units each check spends; 0 only reads the state")

	fs.StringVar(&f.keys, "keys", keysUniform, "key distribution: uniform, zipf (a few hot keys, a long tail) or single (every check on one key, -key-prefix + \"0\")")
	fs.IntVar(&f.nkeys, "nkeys", 1000, fmt.Sprintf("distinct keys for uniform and zipf, 1 to %d", maxKeys))
	fs.Float64Var(&f.zipfS, "zipf-s", 1.1, "Zipf exponent s, > 1; larger means hotter hot keys")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the clients' random key choices; equal seeds give equal key sequences")
	fs.StringVar(&f.keyPrefix, "key-prefix", "k", "start of every key; keys are the prefix followed by 0 to nkeys-1")

	fs.StringVar(&f.redisAddr, "redis", "", "the Redis quotad uses, `host:port` or redis://[user:pass@]host:port/db; when set, INFO commandstats is read before and after the run to report Redis calls per check")
	fs.BoolVar(&f.json, "json", false, "print the report as one JSON object")
	return fs
}

// parseConfig parses and validates args. -help prints the usage to stdout
// and returns errHelp. Every other error names the flag it is about.
func parseConfig(args []string, stdout io.Writer) (config, error) {
	var f rawFlags
	fs := newFlagSet(&f)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(fs, stdout)
			return config{}, errHelp
		}
		return config{}, fmt.Errorf("%w (see quotabench -help)", err)
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q: quotabench takes only flags (see quotabench -help)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	return f.validate(set)
}

// validate turns the raw flags into a config. set holds the flags given on
// the command line, so that a flag that would be ignored is an error rather
// than a surprise.
func (f rawFlags) validate(set map[string]bool) (config, error) {
	c := config{
		Protocol: f.protocol, Clients: f.clients, Duration: f.duration, Requests: f.requests,
		Timeout: f.timeout, Gzip: f.gzip, Policy: f.policy, Fail: f.fail, Cost: f.cost,
		Keys: f.keys, NKeys: f.nkeys, ZipfS: f.zipfS, Seed: f.seed, KeyPrefix: f.keyPrefix,
		JSON: f.json,
	}
	var err error
	if c.Addr, err = validateAddr(f.addr); err != nil {
		return config{}, fmt.Errorf("-addr: %w", err)
	}
	switch f.protocol {
	case protocolConnect, protocolGRPC:
	default:
		return config{}, fmt.Errorf("-protocol: %q is not connect or grpc", f.protocol)
	}
	if f.clients < 1 || f.clients > maxClients {
		return config{}, fmt.Errorf("-clients: %d must be 1 to %d", f.clients, maxClients)
	}
	if f.duration <= 0 || f.duration > maxDuration {
		return config{}, fmt.Errorf("-duration: %s must be > 0 and at most %s, so that the run stops by itself", f.duration, maxDuration)
	}
	if f.requests < 0 {
		return config{}, fmt.Errorf("-requests: %d must be >= 0 (0 means no cap)", f.requests)
	}
	if f.timeout <= 0 || f.timeout > maxTimeout {
		return config{}, fmt.Errorf("-timeout: %s must be > 0 and at most %s", f.timeout, maxTimeout)
	}
	if err := node.ValidatePolicyName(f.policy); err != nil {
		// node's errors start with the field ("policy: ..."), so this
		// reads "-policy: ...".
		return config{}, fmt.Errorf("-%w", err)
	}
	if err := f.validateLimit(&c, set); err != nil {
		return config{}, err
	}
	if err := f.validateKeys(set); err != nil {
		return config{}, err
	}
	if f.keys == keysSingle {
		c.NKeys = 1
	}
	if f.redisAddr != "" {
		if err := redisbench.CheckAddr(f.redisAddr); err != nil {
			return config{}, fmt.Errorf("-redis: %w", err)
		}
		c.Redis = f.redisAddr
	}
	return c, nil
}

// validateAddr accepts an http:// base URL with a host and no query or
// fragment, and returns it without a trailing slash.
func validateAddr(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL: %v", s, err)
	}
	if u.Scheme != "http" {
		return "", fmt.Errorf("%q must be an http:// URL such as http://127.0.0.1:8080 (quotabench speaks cleartext HTTP/1.1 and h2c only)", s)
	}
	if u.Host == "" || u.Hostname() == "" {
		return "", fmt.Errorf("%q has no host", s)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("%q must not carry a query, fragment or user info", s)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// validateLimit decides between a configured policy (no -algorithm) and an
// inline limit (-algorithm with -limit and -period), and checks the cost.
func (f rawFlags) validateLimit(c *config, set map[string]bool) error {
	if f.cost < 0 {
		return fmt.Errorf("-cost: %d must be >= 0", f.cost)
	}
	switch f.fail {
	case "", "open", "closed":
	default:
		return fmt.Errorf("-fail: %q is not open or closed", f.fail)
	}
	if f.algorithm == "" {
		for _, name := range []string{"limit", "period", "burst", "fail"} {
			if set[name] {
				return fmt.Errorf("-%s describes an inline limit and needs -algorithm (or drop it to check the configured policy -policy %s)", name, f.policy)
			}
		}
		if !set["policy"] {
			return errors.New("-policy or -algorithm: say what to check, a configured policy (-policy NAME) or an inline limit (-algorithm ALG -limit N -period D)")
		}
		return nil
	}
	a, err := algorithms.ParseAlgorithm(f.algorithm)
	if err != nil {
		return fmt.Errorf("-algorithm: %w", err)
	}
	if !set["limit"] || f.limit <= 0 {
		return fmt.Errorf("-limit: an inline limit needs -limit > 0 (got %d)", f.limit)
	}
	if !set["period"] || f.period <= 0 {
		return fmt.Errorf("-period: an inline limit needs -period > 0 (got %s)", f.period)
	}
	l := algorithms.Limit{Algorithm: a, Limit: f.limit, Period: f.period, Burst: f.burst}
	// Limit.Validate is the server's own check, so a limit quotad would
	// reject with InvalidArgument on every check is refused here, once.
	if err := l.Validate(); err != nil {
		return fmt.Errorf("-%w", err) // its errors start with the field: "burst: ..."
	}
	if err := l.ValidateCost(f.cost); err != nil {
		return fmt.Errorf("-%w", err)
	}
	c.Inline = &l
	return nil
}

// validateKeys checks the key distribution and refuses flags it would
// ignore.
func (f rawFlags) validateKeys(set map[string]bool) error {
	switch f.keys {
	case keysUniform, keysZipf, keysSingle:
	default:
		return fmt.Errorf("-keys: %q is not uniform, zipf or single", f.keys)
	}
	if f.nkeys < 1 || f.nkeys > maxKeys {
		return fmt.Errorf("-nkeys: %d must be 1 to %d", f.nkeys, maxKeys)
	}
	if f.keys == keysSingle && set["nkeys"] {
		return errors.New("-nkeys: -keys single uses one key; drop -nkeys or use -keys uniform or zipf")
	}
	// NewZipf needs s > 1; NaN fails this test too.
	if !(f.zipfS > 1) || math.IsInf(f.zipfS, 0) {
		return fmt.Errorf("-zipf-s: %v must be a finite number > 1", f.zipfS)
	}
	if f.keys != keysZipf && set["zipf-s"] {
		return fmt.Errorf("-zipf-s: only -keys zipf uses it (got -keys %s)", f.keys)
	}
	// The longest key must stay within quotad's limit.
	if longest := len(f.keyPrefix) + len(strconv.Itoa(f.nkeys-1)); longest > node.MaxKeyLen {
		return fmt.Errorf("-key-prefix: keys would be %d bytes, over quotad's %d", longest, node.MaxKeyLen)
	}
	return nil
}

func usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, `quotabench — load generator for quotad.

Drives a running quotad with concurrent clients for -duration (or until
-requests checks), then reports checks/s, errors by Connect code, latency
percentiles, allowed and denied checks by decision source and, with -redis,
the Redis calls each check cost. Check what? Either a configured policy
(-policy NAME) or an inline limit (-algorithm, -limit, -period, -burst; -policy
is then its namespace).

Usage:
  quotabench [flags]
  quotabench matrix [flags]     the standard matrix against floors in the same run (matrix -help)
  quotabench compare a.json [b.json]   two matrix runs, or two targets of one, cell by cell

Flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	fmt.Fprint(w, `
Examples:
  # one hot key over gRPC: 100 admitted per minute, the rest denied
  quotabench -addr http://127.0.0.1:8080 -algorithm fixed_window -limit 100 -period 1m -keys single

  # a configured policy, Zipf-distributed keys, Redis calls per check
  quotabench -policy api -keys zipf -nkeys 100000 -clients 64 -duration 30s -redis 127.0.0.1:6379

  # scripts: one JSON object
  quotabench -algorithm token_bucket -limit 1000 -period 1s -protocol connect -json

The -redis figures are deltas of INFO commandstats over the whole server (less
quotabench's own INFO calls): run against a Redis that nothing else uses at the
time. Script calls (EVALSHA, EVAL) are the round trips quotad made; "all
commands" also counts the commands those scripts ran inside Redis (TIME, GET,
SET, ...), which Redis lists in commandstats too.
`)
}
