package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// Exit codes of `quotad check`.
const (
	checkAllowed = 0 // the cost was admitted (and spent); also --help
	checkDenied  = 1 // quotad denied it
	checkFailed  = 2 // no decision: bad usage, quotad unreachable, or an error from quotad
)

// checkArgs are the settings of one `quotad check`.
type checkArgs struct {
	addr, policy, key string
	cost              int64
	protocol          quotadclient.Protocol
	timeout           time.Duration
	json              bool
	// limit is the inline limit, when --algorithm, --limit and --period are
	// given.
	limit *algorithms.Limit
	// reset asks for Reset instead of Check.
	reset bool
	// adminToken is the token read from --admin-token-file.
	adminToken string
	// tls is the client's TLS: roots and a client certificate; nil means
	// the system's roots.
	tls *tls.Config
}

// check is `quotad check`: it asks a running quotad for one decision,
// prints it on stdout and returns the exit code (checkAllowed, checkDenied
// or checkFailed). Errors go to stderr. getenv supplies QUOTAD_ADDR.
func check(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	a, err := parseCheckArgs(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return checkAllowed
	}
	if err != nil {
		fmt.Fprintln(stderr, "quotad check:", err)
		return checkFailed
	}
	c, err := quotadclient.New(a.addr, quotadclient.Options{Protocol: a.protocol, TLSConfig: a.tls, AdminToken: a.adminToken})
	if err != nil {
		fmt.Fprintln(stderr, "quotad check:", err)
		return checkFailed
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if a.reset {
		if err := c.Reset(ctx, a.policy, a.key); err != nil {
			fmt.Fprintf(stderr, "quotad check: %s: %v\n", a.addr, err)
			return checkFailed
		}
		if _, err := fmt.Fprintf(stdout, "reset  policy %s\n", a.policy); err != nil {
			fmt.Fprintln(stderr, "quotad check: write:", err)
			return checkFailed
		}
		return checkAllowed
	}
	var d quotadclient.Decision
	if a.limit != nil {
		d, err = c.CheckLimit(ctx, a.policy, *a.limit, a.key, a.cost)
	} else {
		d, err = c.Check(ctx, a.policy, a.key, a.cost)
	}
	if err != nil {
		fmt.Fprintf(stderr, "quotad check: %s: %v\n", a.addr, err)
		return checkFailed
	}
	if a.json {
		err = printDecisionJSON(stdout, d)
	} else {
		_, err = fmt.Fprintln(stdout, formatDecision(d))
	}
	if err != nil {
		fmt.Fprintln(stderr, "quotad check: write:", err)
		return checkFailed
	}
	if !d.Allowed {
		return checkDenied
	}
	return checkAllowed
}

func parseCheckArgs(args []string, getenv func(string) string, stderr io.Writer) (checkArgs, error) {
	fs := flag.NewFlagSet("quotad check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := getenv("QUOTAD_ADDR")
	if addr == "" {
		addr = "http://localhost:8080"
	}
	a := checkArgs{}
	fs.StringVar(&a.addr, "addr", addr, "base `URL` of quotad (env QUOTAD_ADDR)")
	fs.StringVar(&a.policy, "policy", "", "configured policy, or the namespace of the inline limit (required)")
	fs.StringVar(&a.key, "key", "", "the key to check, e.g. a user or an IP (required)")
	fs.Int64Var(&a.cost, "cost", 1, "`units` to spend; 0 reports without spending")
	protocol := fs.String("protocol", "connect", "connect, grpc or grpcweb")
	fs.DurationVar(&a.timeout, "timeout", 5*time.Second, "give up after this long")
	fs.BoolVar(&a.json, "json", false, "print the decision as one JSON object")
	algorithm := fs.String("algorithm", "", "inline limit: fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra or concurrency")
	limit := fs.Int64("limit", 0, "inline limit: `units` per period")
	period := fs.Duration("period", 0, "inline limit: the period, e.g. 1m")
	burst := fs.Int64("burst", 0, "inline limit: capacity of the buckets and gcra (0 means limit)")
	fs.BoolVar(&a.reset, "reset", false, "clear the key's state instead of checking it (Reset, an admin call); prints \"reset\", exit 0")
	tokenFile := fs.String("admin-token-file", "", "`file` with the admin token quotad's --admin-token-file holds, sent as Authorization: Bearer (needed for --reset on such a quotad)")
	caFile := fs.String("tls-ca-file", "", "PEM `file` of the CAs to trust for an https:// --addr instead of the system's")
	certFile := fs.String("tls-cert-file", "", "PEM `file` of this client's certificate, for a quotad that requires one (--tls-client-ca-file)")
	keyFile := fs.String("tls-key-file", "", "PEM `file` of the private key of --tls-cert-file")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: quotad check --policy NAME --key KEY [flags]

Asks a running quotad for one decision and prints it, e.g.
  allowed  limit 5  remaining 4  reset in 12s  (source store)
Exit status: 0 allowed, 1 denied, 2 no decision (bad usage, quotad
unreachable, or an error from quotad such as an unknown policy).

An inline limit (--algorithm, --limit and --period together) is checked
instead of a configured policy, in the namespace --policy.

--reset clears the key instead (Reset; exit 0 once done): on a quotad with an
admin token it needs --admin-token-file. For a quotad serving TLS give an https:// --addr;
--tls-ca-file trusts a private CA, --tls-cert-file and --tls-key-file present
a client certificate.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return checkArgs{}, err
	}
	if fs.NArg() > 0 {
		return checkArgs{}, fmt.Errorf("unexpected argument %q (see quotad check --help)", fs.Arg(0))
	}
	if a.policy == "" || a.key == "" {
		return checkArgs{}, errors.New("--policy and --key are required (see quotad check --help)")
	}
	if a.timeout <= 0 {
		return checkArgs{}, fmt.Errorf("--timeout: %v must be > 0", a.timeout)
	}
	p, err := quotadclient.ParseProtocol(*protocol)
	if err != nil {
		return checkArgs{}, fmt.Errorf("--protocol: %w", err)
	}
	a.protocol = p
	if a.adminToken, err = readAdminToken(*tokenFile); err != nil {
		return checkArgs{}, fmt.Errorf("--admin-token-file: %w", err)
	}
	if a.tls, err = clientTLS("--tls", *caFile, *certFile, *keyFile); err != nil {
		return checkArgs{}, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if a.reset && (set["cost"] || set["algorithm"] || set["limit"] || set["period"] || set["burst"] || a.json) {
		return checkArgs{}, errors.New("--reset takes --policy and --key only (no cost, inline limit or --json)")
	}
	switch {
	case set["algorithm"] && set["limit"] && set["period"]:
		alg, err := algorithms.ParseAlgorithm(*algorithm)
		if err != nil {
			return checkArgs{}, fmt.Errorf("--algorithm: %w", err)
		}
		// quotad validates the limit too; checking here names the flags.
		l := algorithms.Limit{Algorithm: alg, Limit: *limit, Period: *period, Burst: *burst}
		if err := l.Validate(); err != nil {
			return checkArgs{}, fmt.Errorf("inline limit: %w", err)
		}
		a.limit = &l
	case set["algorithm"] || set["limit"] || set["period"] || set["burst"]:
		return checkArgs{}, errors.New("an inline limit needs --algorithm, --limit and --period together (--burst is optional)")
	}
	return a, nil
}

// formatDecision is the one-line human form of d:
//
//	allowed  limit 5  remaining 4  reset in 12s  (source store)
//	denied  limit 5  remaining 0  retry in 41.337s  reset in 41.337s  (source store)
func formatDecision(d quotadclient.Decision) string {
	verdict := "allowed"
	retry := ""
	if !d.Allowed {
		verdict = "denied"
		retry = fmt.Sprintf("  retry in %v", d.RetryAfter.Round(time.Millisecond))
	}
	slot := ""
	if d.Slot != "" {
		// A concurrency limit: the slot lives its period unless renewed.
		slot = fmt.Sprintf("  slot %s (expires in %v)", d.Slot, d.SlotExpiresAfter)
	}
	return fmt.Sprintf("%s  limit %d  remaining %d%s  reset in %v  (source %s)%s",
		verdict, d.Limit, d.Remaining, retry, d.ResetAfter.Round(time.Millisecond), d.Source, slot)
}

// decisionJSON is the --json form: durations in whole milliseconds, as
// quotad counts them.
type decisionJSON struct {
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMS int64  `json:"reset_after_ms"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Source       string `json:"source"`
	// Concurrency limits only: the slot taken and how long it lives.
	SlotID             string `json:"slot_id,omitempty"`
	SlotExpiresAfterMS int64  `json:"slot_expires_after_ms,omitempty"`
}

func printDecisionJSON(w io.Writer, d quotadclient.Decision) error {
	return json.NewEncoder(w).Encode(decisionJSON{
		Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		ResetAfterMS: d.ResetAfter.Milliseconds(), RetryAfterMS: d.RetryAfter.Milliseconds(),
		Source: string(d.Source),
		SlotID: d.Slot, SlotExpiresAfterMS: d.SlotExpiresAfter.Milliseconds(),
	})
}

// clientTLS is the TLS configuration of a client's flags prefix-ca-file,
// prefix-cert-file and prefix-key-file (`quotad check --tls-*`, prefix
// "--tls"): nil when no flag is set (the system's roots).
func clientTLS(prefix, caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		raw, err := readFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s-ca-file: %w", prefix, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(raw) {
			return nil, fmt.Errorf("%s-ca-file %s: no PEM certificate in it", prefix, caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%s-cert-file and %s-key-file go together", prefix, prefix)
	}
	if certFile != "" {
		pair, err := loadKeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s-cert-file: %w", prefix, err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}
