package main

import (
	"slices"
	"strings"
	"time"
)

// This file is quotabench matrix's record of a run: what ran, where, and
// each cell's figures, with their ratios to the floors of the same run.

// matrixRun is a whole run: what ran, where, and every cell.
type matrixRun struct {
	Started   time.Time `json:"started"`
	Host      string    `json:"host"`
	CPUs      int       `json:"cpus"`
	GoVersion string    `json:"go_version"`
	// LoadAverage is /proc/loadavg's 1, 5 and 15 minute figures at the
	// start and the end.
	LoadAverageStart string         `json:"load_average_start"`
	LoadAverageEnd   string         `json:"load_average_end"`
	Redis            string         `json:"redis"`
	Args             []string       `json:"args"`
	Duration         string         `json:"duration_per_cell"`
	Warmup           string         `json:"warmup_per_cell"`
	Targets          []matrixTarget `json:"targets"`
	Cells            []cellResult   `json:"cells"`
	// Medians, in a run of more than one round, is each target cell's
	// median over the rounds (medianCells).
	Medians []cellMedian `json:"medians,omitempty"`
}

// cellResult is one target measured in one scenario, transport and client
// count. Per-check figures divide by checks (a batch call holds many);
// latencies are per call.
type cellResult struct {
	Scenario string `json:"scenario"`
	Via      string `json:"via"`
	Clients  int    `json:"clients"`
	// Round is the pass over the plan the cell was measured in, from 1.
	Round int `json:"round"`
	// Target is a quotad target's name, "grpc-floor", "redis-floor", a
	// sorted-set floor's (logFloorName, logScriptFloorName) or a paced
	// floor's (pacedFloorPrefix, pacedLogScriptFloorPrefix).
	Target          string           `json:"target"`
	Calls           int64            `json:"calls"`
	Checks          int64            `json:"checks"`
	Allowed         int64            `json:"allowed"`
	Denied          int64            `json:"denied"`
	Errors          int64            `json:"errors"`
	ErrorsByCode    map[string]int64 `json:"errors_by_code,omitempty"`
	FirstError      string           `json:"first_error,omitempty"`
	Sources         map[string]int64 `json:"sources,omitempty"`
	ElapsedSeconds  float64          `json:"elapsed_seconds"`
	ChecksPerSecond float64          `json:"checks_per_second"`
	Latency         latencyReport    `json:"latency_ms"`
	// ServerCPUMicros is the server's CPU per check; nil when its pid is
	// unknown (the Redis floor's server is Redis: see RedisCPUMicros).
	ServerCPUMicros *float64 `json:"server_cpu_us_per_check,omitempty"`
	// ServerSyscalls is the server's read+write syscalls per check; nil
	// when /proc/<pid>/io cannot be read.
	ServerSyscalls *float64 `json:"server_rw_syscalls_per_check,omitempty"`
	// RedisCPUMicros and RedisCommands are per check, over the whole Redis
	// server (its own INFO readings excluded from the commands).
	RedisCPUMicros float64 `json:"redis_cpu_us_per_check"`
	RedisCommands  float64 `json:"redis_commands_per_check"`
	// RedisCommandsByName is RedisCommands by command, as Redis names
	// them ("evalsha", "set", and the commands scripts ran).
	RedisCommandsByName map[string]float64 `json:"redis_commands_per_check_by_name,omitempty"`
	// ClientCPUMicros is the load generator's CPU per check.
	ClientCPUMicros float64 `json:"client_cpu_us_per_check"`
	// ServerToFloor is ServerCPUMicros over the gRPC floor's in the same
	// transport and client count; RedisToFloor is RedisCPUMicros over the
	// Redis floor's at the same client count (cold scenario only), and
	// RedisToPacedFloor over that of the Redis floor sent at this cell's
	// own checks/s right after it (its Target is pacedFloorPrefix + this
	// cell's, its Via this cell's). RedisToLogFloor and
	// RedisToLogScriptFloor are RedisCPUMicros over the sorted-set floors'
	// (logFloorName, logScriptFloorName) at the same client count, when
	// the run measured them; RedisToPacedLogScriptFloor over the scripted
	// one's sent at this cell's own checks/s (pacedLogScriptFloorPrefix).
	ServerToFloor         *float64 `json:"server_cpu_to_grpc_floor,omitempty"`
	RedisToFloor          *float64 `json:"redis_cpu_to_redis_floor,omitempty"`
	RedisToPacedFloor     *float64 `json:"redis_cpu_to_paced_redis_floor,omitempty"`
	RedisToLogFloor       *float64 `json:"redis_cpu_to_log_floor,omitempty"`
	RedisToLogScriptFloor *float64 `json:"redis_cpu_to_log_script_floor,omitempty"`
	// RedisToPacedLogScriptFloor: see RedisToLogScriptFloor.
	RedisToPacedLogScriptFloor *float64 `json:"redis_cpu_to_paced_log_script_floor,omitempty"`
	LoadAverage                string   `json:"load_average_after"`
}

// fillRatios sets each cell's ratios to the floors measured in the same
// round of the run: server CPU to the gRPC floor of the same transport and
// client count, and (cold keys) Redis CPU to the Redis floor of the same
// client count.
func fillRatios(cells []cellResult) {
	byRound := map[int][]int{}
	for i, c := range cells {
		byRound[c.Round] = append(byRound[c.Round], i)
	}
	for _, idx := range byRound {
		round := make([]cellResult, len(idx))
		for j, i := range idx {
			round[j] = cells[i]
		}
		fillRoundRatios(round)
		for j, i := range idx {
			cells[i] = round[j]
		}
	}
}

// fillRoundRatios is fillRatios over the cells of one round.
func fillRoundRatios(cells []cellResult) {
	type key struct {
		via     string
		clients int
	}
	type pacedKey struct {
		via     string
		clients int
		target  string
	}
	grpcFloor := map[key]float64{}
	redisFloor := map[int]float64{}
	logFloor := map[int]float64{}
	logScriptFloor := map[int]float64{}
	pacedFloor := map[pacedKey]float64{}
	pacedLogScriptFloor := map[pacedKey]float64{}
	for _, c := range cells {
		switch {
		case strings.HasPrefix(c.Target, pacedLogScriptFloorPrefix):
			pacedLogScriptFloor[pacedKey{c.Via, c.Clients, strings.TrimPrefix(c.Target, pacedLogScriptFloorPrefix)}] = c.RedisCPUMicros
		case c.Target == "grpc-floor" && c.ServerCPUMicros != nil:
			grpcFloor[key{c.Via, c.Clients}] = *c.ServerCPUMicros
		case c.Target == "redis-floor":
			redisFloor[c.Clients] = c.RedisCPUMicros
		case c.Target == logFloorName:
			logFloor[c.Clients] = c.RedisCPUMicros
		case c.Target == logScriptFloorName:
			logScriptFloor[c.Clients] = c.RedisCPUMicros
		case strings.HasPrefix(c.Target, pacedFloorPrefix):
			pacedFloor[pacedKey{c.Via, c.Clients, strings.TrimPrefix(c.Target, pacedFloorPrefix)}] = c.RedisCPUMicros
		}
	}
	for i := range cells {
		c := &cells[i]
		if isFloor(c.Target) {
			continue
		}
		if c.Scenario == "cold" {
			c.RedisToPacedFloor = overFloor(c.RedisCPUMicros, pacedFloor, pacedKey{c.Via, c.Clients, c.Target})
			c.RedisToFloor = overFloor(c.RedisCPUMicros, redisFloor, c.Clients)
			c.RedisToLogFloor = overFloor(c.RedisCPUMicros, logFloor, c.Clients)
			c.RedisToLogScriptFloor = overFloor(c.RedisCPUMicros, logScriptFloor, c.Clients)
			c.RedisToPacedLogScriptFloor = overFloor(c.RedisCPUMicros, pacedLogScriptFloor, pacedKey{c.Via, c.Clients, c.Target})
		}
		if f, ok := grpcFloor[key{c.Via, c.Clients}]; ok && f > 0 && c.ServerCPUMicros != nil && c.Scenario != "batch" {
			r := *c.ServerCPUMicros / f
			c.ServerToFloor = &r
		}
	}
}

// isFloor reports whether target names a floor rather than a target.
func isFloor(target string) bool {
	switch target {
	case "grpc-floor", "redis-floor", logFloorName, logScriptFloorName:
		return true
	}
	return strings.HasPrefix(target, pacedFloorPrefix) || strings.HasPrefix(target, pacedLogScriptFloorPrefix)
}

// overFloor is v over floors[k], or nil when no such floor was measured.
func overFloor[K comparable](v float64, floors map[K]float64, k K) *float64 {
	f, ok := floors[k]
	if !ok || f <= 0 {
		return nil
	}
	r := v / f
	return &r
}

// spread is one figure over the rounds of a run.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// cellMedian is one target cell (scenario, transport, client count and
// target) over the rounds of a run: each figure's median, least and
// greatest. A ratio's median is the median of the ratios each round
// measured against its own floor, not a ratio of medians.
type cellMedian struct {
	Scenario                   string  `json:"scenario"`
	Via                        string  `json:"via"`
	Clients                    int     `json:"clients"`
	Target                     string  `json:"target"`
	Rounds                     int     `json:"rounds"`
	ChecksPerSecond            *spread `json:"checks_per_second"`
	ServerCPUMicros            *spread `json:"server_cpu_us_per_check,omitempty"`
	RedisCPUMicros             *spread `json:"redis_cpu_us_per_check"`
	ServerToFloor              *spread `json:"server_cpu_to_grpc_floor,omitempty"`
	RedisToFloor               *spread `json:"redis_cpu_to_redis_floor,omitempty"`
	RedisToPacedFloor          *spread `json:"redis_cpu_to_paced_redis_floor,omitempty"`
	RedisToLogFloor            *spread `json:"redis_cpu_to_log_floor,omitempty"`
	RedisToLogScriptFloor      *spread `json:"redis_cpu_to_log_script_floor,omitempty"`
	RedisToPacedLogScriptFloor *spread `json:"redis_cpu_to_paced_log_script_floor,omitempty"`
}

// medianCells summarises the target cells of a run of several rounds, in
// the order they first ran; nil for a run of one round.
func medianCells(cells []cellResult) []cellMedian {
	type key struct {
		scenario, via string
		clients       int
		target        string
	}
	var order []key
	groups := map[key][]cellResult{}
	for _, c := range cells {
		if isFloor(c.Target) {
			continue
		}
		k := key{c.Scenario, c.Via, c.Clients, c.Target}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], c)
	}
	rounds := map[int]bool{}
	for _, c := range cells {
		rounds[c.Round] = true
	}
	if len(rounds) < 2 {
		return nil
	}
	out := make([]cellMedian, 0, len(order))
	for _, k := range order {
		g := groups[k]
		of := func(f func(cellResult) *float64) *spread {
			var vs []float64
			for _, c := range g {
				if v := f(c); v != nil {
					vs = append(vs, *v)
				}
			}
			return spreadOf(vs)
		}
		out = append(out, cellMedian{
			Scenario: k.scenario, Via: k.via, Clients: k.clients, Target: k.target, Rounds: len(g),
			ChecksPerSecond:            of(func(c cellResult) *float64 { return &c.ChecksPerSecond }),
			ServerCPUMicros:            of(func(c cellResult) *float64 { return c.ServerCPUMicros }),
			RedisCPUMicros:             of(func(c cellResult) *float64 { return &c.RedisCPUMicros }),
			ServerToFloor:              of(func(c cellResult) *float64 { return c.ServerToFloor }),
			RedisToFloor:               of(func(c cellResult) *float64 { return c.RedisToFloor }),
			RedisToPacedFloor:          of(func(c cellResult) *float64 { return c.RedisToPacedFloor }),
			RedisToLogFloor:            of(func(c cellResult) *float64 { return c.RedisToLogFloor }),
			RedisToLogScriptFloor:      of(func(c cellResult) *float64 { return c.RedisToLogScriptFloor }),
			RedisToPacedLogScriptFloor: of(func(c cellResult) *float64 { return c.RedisToPacedLogScriptFloor }),
		})
	}
	return out
}

// spreadOf is vs's median (of an even count, the mean of the middle two),
// least and greatest; nil for no values.
func spreadOf(vs []float64) *spread {
	if len(vs) == 0 {
		return nil
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return &spread{Median: m, Min: s[0], Max: s[n-1]}
}
