package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/rpc"
)

// The bounds on what clients can make a node keep reach their packages from the
// file, the environment and flags, and zero values stand for the
// packages' defaults.
func TestBoundsSettings(t *testing.T) {
	file := writeFile(t, "q.yaml", "max_inline_period: 1h\nmemory_max_keys: 5000\nread_timeout: 5s\nidle_timeout: 1m\nmax_connections: 300\nlease:\n  max_keys: 70\n")
	c, err := loadConfig([]string{"--config", file, "--idle-timeout", "45s"}, func(k string) string {
		return map[string]string{"QUOTAD_MAX_CONNECTIONS": "400"}[k]
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := rpc.ServerConfig{ReadTimeout: 5 * time.Second, IdleTimeout: 45 * time.Second, MaxConnections: 400}
	if c.Server != want || c.MemoryMaxKeys != 5000 || c.rpcConfig().MaxInlinePeriod != time.Hour || c.nodeConfig().Lease.MaxKeys != 70 {
		t.Fatalf("server %+v, memory max keys %d, max inline period %s, lease max keys %d", c.Server, c.MemoryMaxKeys, c.MaxInlinePeriod, c.Lease.MaxKeys)
	}
	d, err := loadConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.Server != (rpc.ServerConfig{}) || d.MemoryMaxKeys != 0 || d.MaxInlinePeriod != 0 || d.Lease.MaxKeys != 0 {
		t.Fatalf("defaults are not the packages' (zero values): %+v", d)
	}
}

// Bad bounds stop quotad with an error naming the setting (docs/errors.md).
func TestBoundsConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		file string
		want string
	}{
		{name: "negative max connections", args: []string{"--max-connections", "-1"}, want: "config: max connections: invalid config: -1 must be > 0 (0 means 10000)"},
		{name: "bad read timeout", args: []string{"--read-timeout", "slow"}, want: `flag --read-timeout: invalid duration "slow"`},
		{name: "negative read header timeout", file: "read_header_timeout: -1s\n", want: "config: read header timeout: invalid config: -1s must not be negative (0 means the default)"},
		{name: "negative idle timeout", file: "idle_timeout: -1s\n", want: "config: idle timeout: invalid config: -1s must not be negative (0 means the default)"},
		{name: "inline period over a year", args: []string{"--max-inline-period", "9000h"}, want: "config: max inline period: invalid config: 9000h0m0s must be 1ms to 8760h0m0s (0 means 24h0m0s)"},
		{name: "negative memory max keys", args: []string{"--memory-max-keys", "-5"}, want: "config: memory max keys: invalid config: -5 must be > 0 (0 means 250000)"},
		{name: "negative lease max keys", file: "lease:\n  max_keys: -1\n", want: "config: lease max keys: invalid config: -1 must be > 0 (0 means 50000)"},
		{name: "lease hold over an hour", args: []string{"--lease-hold", "2h"}, want: "config: lease hold: invalid config: 2h0m0s exceeds 1h0m0s"},
		{name: "redis batch window over a twentieth of the timeout", args: []string{"--redis", "redis://127.0.0.1:1", "--redis-batch-window", "10ms"}, want: "config: redis batch window: invalid config: 10ms exceeds a twentieth of the redis timeout 50ms (2.5ms)"},
		{name: "negative redis batch window", args: []string{"--redis", "redis://127.0.0.1:1", "--redis-batch-window", "-1ms"}, want: "config: redis batch window: invalid config: -1ms must not be negative (0 never waits)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"--config", writeFile(t, "q.yaml", tc.file)}, args...)
			}
			_, err := loadConfig(args, func(string) string { return "" }, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
