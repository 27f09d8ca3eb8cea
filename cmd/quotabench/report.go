package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// report is a run's result, printed as text or, with -json, as one JSON
// object with these field names.
type report struct {
	Config reportConfig `json:"config"`
	// ElapsedSeconds is from the first check started to the last finished.
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// Checks is every check sent that completed: Allowed + Denied + Errors.
	Checks  int64 `json:"checks"`
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
	Errors  int64 `json:"errors"`
	// ChecksPerSecond is Checks / ElapsedSeconds.
	ChecksPerSecond float64 `json:"checks_per_second"`
	// Sources counts allowed and denied checks by the response's source,
	// named without the SOURCE_ prefix: STORE, LEASE, DENIED_CACHE,
	// FAIL_OPEN, FAIL_CLOSED (UNSPECIFIED if quotad sent none). Sources
	// that decided nothing are left out.
	Sources map[string]sourceCount `json:"sources"`
	// ErrorsByCode counts failed checks by Connect code name
	// ("unavailable", "deadline_exceeded", ...).
	ErrorsByCode map[string]int64 `json:"errors_by_code"`
	// Latency is of the answered checks (allowed or denied), in
	// milliseconds, as the client saw it.
	Latency latencyReport `json:"latency_ms"`
	// Redis is present with -redis.
	Redis *redisReport `json:"redis,omitempty"`
}

type sourceCount struct {
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
}

type latencyReport struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// reportConfig echoes what was run.
type reportConfig struct {
	Addr      string       `json:"addr"`
	Protocol  string       `json:"protocol"`
	Clients   int          `json:"clients"`
	Duration  string       `json:"duration"`
	Requests  int64        `json:"requests"`
	Policy    string       `json:"policy"`
	Limit     *reportLimit `json:"limit,omitempty"`
	Cost      int64        `json:"cost"`
	Keys      string       `json:"keys"`
	NKeys     int          `json:"nkeys"`
	ZipfS     float64      `json:"zipf_s,omitempty"`
	Seed      uint64       `json:"seed"`
	KeyPrefix string       `json:"key_prefix"`
}

type reportLimit struct {
	Algorithm string `json:"algorithm"`
	Limit     int64  `json:"limit"`
	Period    string `json:"period"`
	Burst     int64  `json:"burst"`
	Fail      string `json:"on_store_error,omitempty"`
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// sourceName is s without the SOURCE_ prefix.
func sourceName(i int) string {
	return strings.TrimPrefix(quotadv1.Source(i).String(), "SOURCE_")
}

func newReport(cfg config, o outcome, r *redisReport) report {
	rep := report{
		Config: reportConfig{
			Addr: cfg.Addr, Protocol: cfg.Protocol, Clients: cfg.Clients,
			Duration: cfg.Duration.String(), Requests: cfg.Requests, Policy: cfg.Policy,
			Cost: cfg.Cost, Keys: cfg.Keys, NKeys: cfg.NKeys, Seed: cfg.Seed, KeyPrefix: cfg.KeyPrefix,
		},
		ElapsedSeconds: o.elapsed.Seconds(),
		Errors:         o.failed(),
		Sources:        map[string]sourceCount{},
		ErrorsByCode:   map[string]int64{},
		Latency: latencyReport{
			P50:  millis(o.latency.quantile(0.50)),
			P90:  millis(o.latency.quantile(0.90)),
			P99:  millis(o.latency.quantile(0.99)),
			P999: millis(o.latency.quantile(0.999)),
			Max:  millis(o.latency.max),
		},
		Redis: r,
	}
	if cfg.Keys == keysZipf {
		rep.Config.ZipfS = cfg.ZipfS
	}
	if l := cfg.Inline; l != nil {
		rep.Config.Limit = &reportLimit{Algorithm: l.Algorithm.String(), Limit: l.Limit, Period: l.Period.String(), Burst: l.Burst, Fail: cfg.Fail}
	}
	rep.Allowed, rep.Denied = o.answered()
	rep.Checks = rep.Allowed + rep.Denied + rep.Errors
	if o.elapsed > 0 {
		rep.ChecksPerSecond = float64(rep.Checks) / o.elapsed.Seconds()
	}
	for i := range numSources {
		if o.allowed[i] != 0 || o.denied[i] != 0 {
			rep.Sources[sourceName(i)] = sourceCount{Allowed: o.allowed[i], Denied: o.denied[i]}
		}
	}
	for c, n := range o.errors {
		rep.ErrorsByCode[c.String()] = n
	}
	return rep
}

func (rep report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func pct(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

func (rep report) writeText(w io.Writer) error {
	c := rep.Config
	var b strings.Builder
	what := "policy " + c.Policy
	if l := c.Limit; l != nil {
		what = fmt.Sprintf("inline %s %d/%s", l.Algorithm, l.Limit, l.Period)
		if l.Burst != 0 {
			what += fmt.Sprintf(" burst %d", l.Burst)
		}
		what += " in namespace " + c.Policy
	}
	keys := c.Keys
	switch c.Keys {
	case keysZipf:
		keys = fmt.Sprintf("zipf s=%g over %d keys", c.ZipfS, c.NKeys)
	case keysUniform:
		keys = fmt.Sprintf("uniform over %d keys", c.NKeys)
	case keysSingle:
		keys = "single key"
	}
	fmt.Fprintf(&b, "quotabench: %s, %s, %d clients, %s cost %d, keys %s (prefix %q, seed %d)\n",
		c.Addr, c.Protocol, c.Clients, what, c.Cost, keys, c.KeyPrefix, c.Seed)
	fmt.Fprintf(&b, "\nchecks     %d in %.3fs = %.0f checks/s\n", rep.Checks, rep.ElapsedSeconds, rep.ChecksPerSecond)
	fmt.Fprintf(&b, "allowed    %d (%.1f%%)\n", rep.Allowed, pct(rep.Allowed, rep.Checks))
	fmt.Fprintf(&b, "denied     %d (%.1f%%)\n", rep.Denied, pct(rep.Denied, rep.Checks))
	fmt.Fprintf(&b, "errors     %d (%.1f%%)\n", rep.Errors, pct(rep.Errors, rep.Checks))
	codes := make([]string, 0, len(rep.ErrorsByCode))
	for code := range rep.ErrorsByCode {
		codes = append(codes, code)
	}
	sort.Strings(codes)
	for _, code := range codes {
		fmt.Fprintf(&b, "  %-20s %d\n", code, rep.ErrorsByCode[code])
	}
	l := rep.Latency
	fmt.Fprintf(&b, "\nlatency (answered checks)  p50 %s  p90 %s  p99 %s  p99.9 %s  max %s\n",
		fmtMillis(l.P50), fmtMillis(l.P90), fmtMillis(l.P99), fmtMillis(l.P999), fmtMillis(l.Max))

	fmt.Fprintf(&b, "\nby source\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  source\tallowed\t%%\tdenied\t%%\t\n")
	for i := range numSources {
		name := sourceName(i)
		s, ok := rep.Sources[name]
		if !ok && i == 0 {
			continue
		}
		fmt.Fprintf(tw, "  %s\t%d\t%.1f\t%d\t%.1f\t\n", name, s.Allowed, pct(s.Allowed, rep.Allowed), s.Denied, pct(s.Denied, rep.Denied))
	}
	tw.Flush()

	if r := rep.Redis; r != nil {
		fmt.Fprintf(&b, "\nredis (INFO commandstats delta, %d own INFO call(s) subtracted)\n", r.OwnInfoCalls)
		fmt.Fprintf(&b, "  script calls (EVALSHA/EVAL)  %d = %.3f per check, %.3f per allowed check\n", r.Scripts, r.ScriptsPerCheck, r.ScriptsPerAllowedCheck)
		fmt.Fprintf(&b, "  all commands                 %d = %.3f per check, %.3f per allowed check\n", r.Commands, r.CommandsPerCheck, r.CommandsPerAllowedCheck)
		fmt.Fprintf(&b, "  EVALSHA/EVAL share           %.1f%% of all commands (Redis also counts the commands scripts run)\n", 100*r.ScriptShare)
		for _, name := range r.sortedCommands() {
			fmt.Fprintf(&b, "    %-24s %d\n", name, r.ByCommand[name])
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// fmtMillis prints a latency in milliseconds with sensible precision.
func fmtMillis(ms float64) string {
	d := time.Duration(ms * float64(time.Millisecond))
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", ms*1000)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", ms)
	default:
		return fmt.Sprintf("%.1fms", ms)
	}
}
