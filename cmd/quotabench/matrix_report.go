package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// The matrix's output: a text table, a JSON file, and the comparison of two
// targets or two runs.

func writeMatrixText(w io.Writer, run *matrixRun) error {
	var b strings.Builder
	fmt.Fprintf(&b, "quotabench matrix on %s: %d CPUs, %s, %s\n", run.Host, run.CPUs, run.GoVersion, run.Redis)
	fmt.Fprintf(&b, "load average %s at the start, %s at the end; %s per cell after %s warm-up\n",
		run.LoadAverageStart, run.LoadAverageEnd, run.Duration, run.Warmup)
	for _, t := range run.Targets {
		what := t.Binary
		if what == "" {
			what = "running at " + t.Addr
		}
		fmt.Fprintf(&b, "target %s: %s (pid %d)\n", t.Name, what, t.PID)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	// The sorted-set floors' columns only in a run that measured them.
	logFloor := false
	for _, c := range run.Cells {
		logFloor = logFloor || c.RedisToLogFloor != nil || c.RedisToLogScriptFloor != nil
	}
	// A round column only in a run of several.
	rounds := len(run.Medians) > 0
	if rounds {
		fmt.Fprint(tw, "round\t")
	}
	fmt.Fprint(tw, "scenario\tvia\tc\ttarget\tchecks/s\tp50\tp99\tsrv µs/chk\t×grpc floor\tsyscalls/chk\tredis µs/chk\t×redis floor\t×paced floor\t")
	if logFloor {
		fmt.Fprint(tw, "×log floor\t×log script\t×paced log script\t")
	}
	fmt.Fprint(tw, "redis cmd/chk\tclient µs/chk\terrors\t\n")
	for _, c := range run.Cells {
		if rounds {
			fmt.Fprintf(tw, "%d\t", c.Round)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t",
			c.Scenario, c.Via, c.Clients, c.Target, c.ChecksPerSecond,
			fmtMillis(c.Latency.P50), fmtMillis(c.Latency.P99),
			optional(c.ServerCPUMicros, "%.1f"), optional(c.ServerToFloor, "%.2f"), optional(c.ServerSyscalls, "%.2f"),
			c.RedisCPUMicros, optional(c.RedisToFloor, "%.2f"), optional(c.RedisToPacedFloor, "%.2f"))
		if logFloor {
			fmt.Fprintf(tw, "%s\t%s\t%s\t", optional(c.RedisToLogFloor, "%.2f"), optional(c.RedisToLogScriptFloor, "%.2f"), optional(c.RedisToPacedLogScriptFloor, "%.2f"))
		}
		fmt.Fprintf(tw, "%.3f\t%.1f\t%d\t\n", c.RedisCommands, c.ClientCPUMicros, c.Errors)
	}
	tw.Flush()
	if rounds {
		writeMedians(&b, run.Medians, logFloor)
	}
	for _, c := range run.Cells {
		if c.FirstError != "" {
			fmt.Fprintf(&b, "errors in %s %s c=%d %s: %v, first: %s\n", c.Scenario, c.Via, c.Clients, c.Target, c.ErrorsByCode, c.FirstError)
		}
	}
	b.WriteString(`
srv µs/chk and syscalls/chk: the server process's CPU (user+system, /proc/<pid>/stat)
and read+write syscalls (/proc/<pid>/io) per check; ×grpc floor: over the bare grpc-go
server's, same transport and clients. redis µs/chk: INFO used_cpu_user+sys per check;
×redis floor: over pipelined INCRBY+PEXPIRE's, sent as fast as Redis answers; ×paced
floor: over the same sent at the cell's own checks/s (the redis-floor@TARGET row after
it), since Redis spends more per command when fewer arrive per wakeup. p50/p99 are per
call (a batch call holds many checks). client µs/chk: the load generator's own CPU.
`)
	if logFloor {
		b.WriteString(`×log floor: over the log-floor row's, a sliding log kept as the common recipe keeps
it (ZREMRANGEBYSCORE, ZADD, ZCARD, PEXPIRE pipelined per check); ×log script: over the
log-script-floor row's, the same recipe made exact in one script call per check (ZADD only
under the limit); both sent as fast as Redis answers. ×paced log script: over the
scripted one's sent at the cell's own checks/s (the log-script-floor@TARGET row after it).
`)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeMedians is the table of each target cell's median over the rounds,
// with its least and greatest beside it.
func writeMedians(b *strings.Builder, medians []cellMedian, logFloor bool) {
	fmt.Fprintf(b, "\nmedian over the rounds (least–greatest):\n\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "scenario\tvia\tc\ttarget\trounds\tchecks/s\tsrv µs/chk\t×grpc floor\tredis µs/chk\t×redis floor\t×paced floor\t")
	if logFloor {
		fmt.Fprint(tw, "×log floor\t×log script\t×paced log script\t")
	}
	fmt.Fprint(tw, "\n")
	for _, m := range medians {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t",
			m.Scenario, m.Via, m.Clients, m.Target, m.Rounds,
			fmtSpread(m.ChecksPerSecond, "%.0f"), fmtSpread(m.ServerCPUMicros, "%.1f"), fmtSpread(m.ServerToFloor, "%.2f"),
			fmtSpread(m.RedisCPUMicros, "%.1f"), fmtSpread(m.RedisToFloor, "%.2f"), fmtSpread(m.RedisToPacedFloor, "%.2f"))
		if logFloor {
			fmt.Fprintf(tw, "%s\t%s\t%s\t", fmtSpread(m.RedisToLogFloor, "%.2f"), fmtSpread(m.RedisToLogScriptFloor, "%.2f"), fmtSpread(m.RedisToPacedLogScriptFloor, "%.2f"))
		}
		fmt.Fprint(tw, "\n")
	}
	tw.Flush()
}

// fmtSpread is "median (least–greatest)" in format, or "-".
func fmtSpread(s *spread, format string) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf(format+" ("+format+"–"+format+")", s.Median, s.Min, s.Max)
}

func optional(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

func writeJSONFile(path string, run *matrixRun) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("-json: %w", err)
	}
	enc := json.NewEncoder(f)
	enc.SetIndent("", "  ")
	if err := enc.Encode(run); err != nil {
		f.Close()
		return fmt.Errorf("-json %s: %w", path, err)
	}
	return f.Close()
}

func readRun(path string) (*matrixRun, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var run matrixRun
	if err := json.Unmarshal(b, &run); err != nil {
		return nil, fmt.Errorf("%s: not a quotabench matrix JSON file: %w", path, err)
	}
	return &run, nil
}

// runCompare is `quotabench compare`: target a of the first file against
// target b of the second (or of the same file), cell by cell.
func runCompare(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("quotabench compare", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a := fs.String("a", "", "the `target` to compare from (default: the first quotad target of the first file)")
	bName := fs.String("b", "", "the `target` to compare to (default: the first quotad target of the second file, or the second of a single file)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, "Usage: quotabench compare [-a NAME] [-b NAME] before.json [after.json]\n\nCompares two targets of quotabench matrix runs cell by cell (after/before ratios).\n\nFlags:\n")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return errHelp
		}
		return err
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		return errors.New("compare: give one or two matrix JSON files (quotabench matrix -json FILE)")
	}
	runA, err := readRun(fs.Arg(0))
	if err != nil {
		return err
	}
	runB := runA
	if fs.NArg() == 2 {
		if runB, err = readRun(fs.Arg(1)); err != nil {
			return err
		}
	}
	nameA, nameB := *a, *bName
	if nameA == "" {
		if len(runA.Targets) == 0 {
			return fmt.Errorf("%s has no quotad target", fs.Arg(0))
		}
		nameA = runA.Targets[0].Name
	}
	if nameB == "" {
		switch {
		case runB != runA && len(runB.Targets) > 0:
			nameB = runB.Targets[0].Name
		case runB == runA && len(runA.Targets) > 1:
			nameB = runA.Targets[1].Name
		default:
			return errors.New("compare: say which target to compare to (-b)")
		}
	}
	return writeComparison(stdout, runA, nameA, runB, nameB)
}

func writeComparison(w io.Writer, runA *matrixRun, nameA string, runB *matrixRun, nameB string) error {
	// Cells match by scenario, transport, client count and round; a file
	// written before rounds has none, and its cells are round 1's.
	type key struct {
		scenario, via  string
		clients, round int
	}
	inB := map[key]cellResult{}
	for _, c := range runB.Cells {
		if c.Target == nameB {
			inB[key{c.Scenario, c.Via, c.Clients, max(c.Round, 1)}] = c
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s (load %s) → %s (load %s); ratios are %s/%s\n\n", nameA, runA.LoadAverageStart, nameB, runB.LoadAverageStart, nameB, nameA)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "scenario\tvia\tc\tchecks/s\t×\tp99\t×\tsrv µs/chk\t×\t×grpc floor\tsyscalls/chk\tredis µs/chk\t×redis floor\t\n")
	matched := 0
	for _, ca := range runA.Cells {
		if ca.Target != nameA {
			continue
		}
		cb, ok := inB[key{ca.Scenario, ca.Via, ca.Clients, max(ca.Round, 1)}]
		if !ok {
			continue
		}
		matched++
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f → %.0f\t%s\t%s → %s\t%s\t%s → %s\t%s\t%s → %s\t%s → %s\t%.1f → %.1f\t%s → %s\t\n",
			ca.Scenario, ca.Via, ca.Clients,
			ca.ChecksPerSecond, cb.ChecksPerSecond, ratio(cb.ChecksPerSecond, ca.ChecksPerSecond),
			fmtMillis(ca.Latency.P99), fmtMillis(cb.Latency.P99), ratio(cb.Latency.P99, ca.Latency.P99),
			optional(ca.ServerCPUMicros, "%.1f"), optional(cb.ServerCPUMicros, "%.1f"), ratioPtr(cb.ServerCPUMicros, ca.ServerCPUMicros),
			optional(ca.ServerToFloor, "%.2f"), optional(cb.ServerToFloor, "%.2f"),
			optional(ca.ServerSyscalls, "%.2f"), optional(cb.ServerSyscalls, "%.2f"),
			ca.RedisCPUMicros, cb.RedisCPUMicros,
			optional(ca.RedisToFloor, "%.2f"), optional(cb.RedisToFloor, "%.2f"))
	}
	tw.Flush()
	if matched == 0 {
		return fmt.Errorf("compare: no cell of %s matches one of %s", nameA, nameB)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ratio(after, before float64) string {
	if before == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", after/before)
}

func ratioPtr(after, before *float64) string {
	if after == nil || before == nil {
		return "-"
	}
	return ratio(*after, *before)
}
