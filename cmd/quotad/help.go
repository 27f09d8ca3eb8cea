package main

import (
	"fmt"
	"io"
	"strings"
)

// This file writes `quotad --help` from the settings table.

// The texts of the flags that are not settings.
const (
	configHelp        = "YAML config file: the policies, Envoy's rules and any setting below; the environment and flags override it"
	versionHelp       = "print quotad's version, commit and Go version, and exit (also: quotad version)"
	printSettingsHelp = "print the effective settings (each setting's value, and whether it came from its default, the config file, the environment or a flag) and exit"
)

// usage writes `quotad --help`: what quotad is, then every setting of all,
// each with its default, environment variable and config file key, then
// the config file's shape and an example.
func usage(w io.Writer, all []setting) {
	fmt.Fprintf(w, `quotad — a distributed quota (rate-limit) service.

Serves quotad.v1.QuotaService over Connect, gRPC, gRPC-Web and HTTP/JSON on one
port (HTTP/1.1 and cleartext HTTP/2, or TLS with --tls-cert-file). With no
flags it listens on %s with the embedded in-memory store; --redis makes
Redis the authoritative store, --memcache memcached (fixed windows only).

Usage:
  quotad [flags]
  quotad check --policy NAME --key KEY [flags]   (one decision; see quotad check --help)
  quotad version                                 (version, commit, Go version)
  quotad envoy-ratelimit                         (configured by envoyproxy/ratelimit's environment, on its ports)

Settings come from defaults, then the --config file, then QUOTAD_* environment
variables, then flags. SIGHUP, or a change to the content of the --config file or
of the --envoy-config-dir files, reloads them: policies, envoy rules and log_level
apply at once; the rest needs a restart.

Flags:
`, defaultConfig().Listen)
	writeFlag(w, "config", "file", configHelp, "default none; env QUOTAD_CONFIG")
	writeFlag(w, "print-settings", "", printSettingsHelp, "")
	writeFlag(w, "version", "", versionHelp, "")
	fmt.Fprint(w, "\nSettings, each with its default, environment variable and config file key:\n")
	for _, s := range all {
		help := s.help
		if s.zeroMeans != "" {
			help += "; 0 means the default"
		}
		writeFlag(w, s.flag, s.arg, help, settingFacts(s))
	}
	fmt.Fprint(w, `
Config file (YAML; unknown fields are errors): every setting above under its
file key, a dot stepping into a section, so that --redis-timeout 80ms is
  redis:
    timeout: 80ms
Besides the settings, the file holds the policies and Envoy's rules:
  policies:
    - name: api                     # [A-Za-z0-9_.-]
      algorithm: token_bucket       # fixed_window | sliding_window_log | sliding_window_counter
                                    # | token_bucket | leaky_bucket | gcra | concurrency
      limit: 100                    # units per period
      period: 1m                    # 1ms to 8760h, whole milliseconds
      burst: 20                     # buckets and gcra; 0 means limit
      on_store_error: closed        # optional: open | closed
      lease: auto                   # optional: auto | off
  envoy:
    domains:                        # Envoy's rate limit service (docs/envoy.md)
      - domain: edge
        descriptors:
          - key: remote_address
            policy: api

Try it:
  curl -s -H 'Content-Type: application/json' localhost:8080/quotad.v1.QuotaService/Check \
    -d '{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60s"}}'
`)
}

// settingFacts is the line of --help under a setting's text: "default
// 50ms; env QUOTAD_REDIS_TIMEOUT; file redis.timeout".
func settingFacts(s setting) string {
	return "default " + s.shownDefault() + "; env " + s.env() + "; file " + s.file
}

// writeFlag writes one flag of --help: its name and argument, then its
// text wrapped, then facts (if any) on a line of their own.
func writeFlag(w io.Writer, name, arg, text, facts string) {
	fmt.Fprintf(w, "  -%s", name)
	if arg != "" {
		fmt.Fprintf(w, " %s", arg)
	}
	fmt.Fprintln(w)
	for _, line := range wrap(text, 74) {
		fmt.Fprintf(w, "      %s\n", line)
	}
	if facts != "" {
		fmt.Fprintf(w, "      %s\n", facts)
	}
}

// wrap breaks text into lines of at most width bytes, at spaces; a word
// longer than width has a line of its own.
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
