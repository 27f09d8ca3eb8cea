// Command quotabench is quotad's load generator. It drives a running quotad
// with concurrent clients for a fixed time (or a fixed number of checks),
// then reports throughput, latency percentiles, errors by Connect code,
// allowed and denied checks by decision source, and — given the Redis quotad
// uses — how many Redis calls each check cost.
//
// It only ever sends checks to the address it is given; `quotabench -help`
// lists every flag with its default. `quotabench matrix` is the standard
// measurement of what a check costs against floors measured in the same
// run, and `quotabench compare` compares two of its runs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if len(os.Args) > 1 && os.Args[1] == floorCommand {
		err = runFloorServer(ctx, os.Args[2:], os.Stdin, os.Stdout)
	} else {
		err = run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}
	stop()
	if err != nil && !errors.Is(err, errHelp) {
		fmt.Fprintln(os.Stderr, "quotabench:", err)
		os.Exit(1)
	}
}

// run is quotabench: parse the flags, drive the quotad at -addr, print the
// report. It returns errHelp after printing -help, and an error when the
// flags are bad, Redis cannot be read, or no check at all succeeded (the
// report is printed first in that last case).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "matrix":
			return runMatrix(ctx, args[1:], stdout, stderr)
		case "compare":
			return runCompare(args[1:], stdout)
		}
	}
	cfg, err := parseConfig(args, stdout)
	if err != nil {
		return err
	}
	var stats *redisStats
	var before commandStats
	if cfg.Redis != "" {
		if stats, err = newRedisStats(cfg.Redis); err != nil {
			return fmt.Errorf("-redis: %w", err)
		}
		defer stats.Close()
		if before, err = stats.read(ctx); err != nil {
			return fmt.Errorf("-redis %s: %w", cfg.Redis, err)
		}
	}

	hc, tr := newHTTPClient(cfg)
	defer tr.CloseIdleConnections()
	if !cfg.JSON {
		fmt.Fprintf(stderr, "quotabench: %d clients against %s over %s for %s%s...\n",
			cfg.Clients, cfg.Addr, cfg.Protocol, cfg.Duration, map[bool]string{true: fmt.Sprintf(" or %d checks", cfg.Requests)}[cfg.Requests > 0])
	}
	o := load(ctx, cfg, newQuotaClient(cfg, hc))
	allowed, denied := o.answered()

	var rr *redisReport
	var redisErr error
	if stats != nil {
		// The first reading counts itself only in the second.
		ownInfos := stats.infos
		after, err := stats.read(context.WithoutCancel(ctx))
		if err != nil {
			redisErr = fmt.Errorf("-redis %s: after the run: %w", cfg.Redis, err)
		} else {
			rr = diffStats(before, after, ownInfos, allowed+denied, allowed)
		}
	}

	rep := newReport(cfg, o, rr)
	if cfg.JSON {
		err = rep.writeJSON(stdout)
	} else {
		err = rep.writeText(stdout)
	}
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	switch {
	case redisErr != nil:
		return redisErr
	case allowed+denied == 0 && rep.Errors > 0:
		return fmt.Errorf("all %d checks failed (%s)", rep.Errors, errorSummary(rep.ErrorsByCode))
	case allowed+denied == 0:
		return errors.New("no check completed")
	}
	return nil
}

// errorSummary lists error codes with counts, most frequent first.
func errorSummary(byCode map[string]int64) string {
	codes := make([]string, 0, len(byCode))
	for c := range byCode {
		codes = append(codes, c)
	}
	sort.Slice(codes, func(i, j int) bool { return byCode[codes[i]] > byCode[codes[j]] })
	parts := make([]string, len(codes))
	for i, c := range codes {
		parts[i] = fmt.Sprintf("%s: %d", c, byCode[c])
	}
	return strings.Join(parts, ", ")
}
