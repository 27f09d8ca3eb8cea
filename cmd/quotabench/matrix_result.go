package main

import (
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
}

// cellResult is one target measured in one scenario, transport and client
// count. Per-check figures divide by checks (a batch call holds many);
// latencies are per call.
type cellResult struct {
	Scenario string `json:"scenario"`
	Via      string `json:"via"`
	Clients  int    `json:"clients"`
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
// run: server CPU to the gRPC floor of the same transport and client
// count, and (cold keys) Redis CPU to the Redis floor of the same client
// count.
func fillRatios(cells []cellResult) {
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
