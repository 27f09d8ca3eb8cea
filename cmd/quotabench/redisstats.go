package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/internal/redisbench"
)

// commandStats is one reading of INFO commandstats: calls per command,
// lower-case names as Redis reports them ("evalsha", "client|setinfo").
type commandStats map[string]int64

// redisStats reads INFO commandstats from the Redis quotad uses. It keeps
// one connection, so the only commands it adds to the server's figures are
// its own INFO calls, which it counts and subtracts.
type redisStats struct {
	client *redisbench.Client
	// infos is how many INFO calls this reader has made.
	infos int64
}

func newRedisStats(addr string) (*redisStats, error) {
	c, err := redisbench.DialOne(addr)
	if err != nil {
		return nil, err
	}
	return &redisStats{client: c}, nil
}

func (r *redisStats) Close() error { return r.client.Close() }

// read returns the current command counts.
func (r *redisStats) read(ctx context.Context) (commandStats, error) {
	r.infos++
	text, err := r.client.Info(ctx, "commandstats")
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	return parseCommandStats(text)
}

// cpu returns the CPU time the Redis server has used, user plus system
// (INFO cpu: used_cpu_user + used_cpu_sys), every thread included.
func (r *redisStats) cpu(ctx context.Context) (time.Duration, error) {
	r.infos++
	text, err := r.client.Info(ctx, "cpu")
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	return parseRedisCPU(text)
}

// parseRedisCPU returns used_cpu_sys + used_cpu_user from INFO cpu, whose
// values are seconds with microsecond digits.
func parseRedisCPU(text string) (time.Duration, error) {
	var total time.Duration
	found := 0
	for line := range strings.Lines(text) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		s, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s %q: %w", k, v, err)
		}
		total += time.Duration(math.Round(s*1e6)) * time.Microsecond
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu: used_cpu_sys and used_cpu_user not both present")
	}
	return total, nil
}

// parseCommandStats parses lines such as
//
//	cmdstat_evalsha:calls=1000,usec=5203,usec_per_call=5.20,rejected_calls=0,failed_calls=0
func parseCommandStats(text string) (commandStats, error) {
	s := commandStats{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		found := false
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			if k != "calls" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("INFO commandstats: %q: bad calls %q", name, v)
			}
			s[name] = n
			found = true
		}
		if !found {
			return nil, fmt.Errorf("INFO commandstats: %q has no calls field", name)
		}
	}
	return s, nil
}

// redisReport is what Redis did during the run.
type redisReport struct {
	// Commands is every command Redis executed between the two readings,
	// less this tool's own INFO calls. Redis counts the commands a Lua
	// script runs (TIME, GET, SET, ...) as well as the EVALSHA that ran
	// it, so this is more than the calls quotad sent.
	Commands int64 `json:"commands"`
	// Scripts is the EVALSHA, EVAL and FCALL calls (and their _RO forms):
	// the calls quotad's Redis store sends, one per store check.
	Scripts int64 `json:"scripts"`
	// ScriptShare is Scripts / Commands.
	ScriptShare float64 `json:"script_share"`
	// ScriptsPerCheck and ScriptsPerAllowedCheck are Scripts per check
	// answered and per check allowed: the Redis round trips a check cost.
	ScriptsPerCheck        float64 `json:"scripts_per_check"`
	ScriptsPerAllowedCheck float64 `json:"scripts_per_allowed_check"`
	// CommandsPerCheck and CommandsPerAllowedCheck are the same for
	// Commands.
	CommandsPerCheck        float64 `json:"commands_per_check"`
	CommandsPerAllowedCheck float64 `json:"commands_per_allowed_check"`
	// ByCommand is the calls of each command that ran, own INFO excluded.
	ByCommand map[string]int64 `json:"by_command"`
	// OwnInfoCalls is how many INFO calls of this tool were subtracted.
	OwnInfoCalls int64 `json:"own_info_calls_subtracted"`
}

// isScriptCall reports whether Redis command name runs a script.
func isScriptCall(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

// diffStats builds the report from two readings. ownInfos is how many INFO
// calls this tool made that the second reading includes (Redis updates a
// command's figures after running it, so the first reading counts itself
// only in the second).
func diffStats(before, after commandStats, ownInfos, checks, allowed int64) *redisReport {
	r := &redisReport{ByCommand: map[string]int64{}, OwnInfoCalls: ownInfos}
	for name, n := range after {
		d := n - before[name]
		if name == "info" {
			d -= ownInfos
		}
		if d <= 0 {
			continue
		}
		r.ByCommand[name] = d
		r.Commands += d
		if isScriptCall(name) {
			r.Scripts += d
		}
	}
	if r.Commands > 0 {
		r.ScriptShare = float64(r.Scripts) / float64(r.Commands)
	}
	if checks > 0 {
		r.ScriptsPerCheck = float64(r.Scripts) / float64(checks)
		r.CommandsPerCheck = float64(r.Commands) / float64(checks)
	}
	if allowed > 0 {
		r.ScriptsPerAllowedCheck = float64(r.Scripts) / float64(allowed)
		r.CommandsPerAllowedCheck = float64(r.Commands) / float64(allowed)
	}
	return r
}

// sortedCommands returns the commands by calls, most first.
func (r *redisReport) sortedCommands() []string {
	names := make([]string, 0, len(r.ByCommand))
	for n := range r.ByCommand {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := r.ByCommand[names[i]], r.ByCommand[names[j]]
		if a != b {
			return a > b
		}
		return names[i] < names[j]
	})
	return names
}
