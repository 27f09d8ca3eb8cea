package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// The peer: envoyproxy/ratelimit, the rate limit service quotad replaces
// for Envoy, started from its own binary (its service_cmd) on the run's
// Redis with the matrix's rules in its own file format, and measured over
// Envoy's RateLimitService only, beside the quotad targets.

// peerRatelimit is the Kind of an envoyproxy/ratelimit target.
const peerRatelimit = "envoyproxy/ratelimit"

// peerConfigYAML is the matrix's rules as envoyproxy/ratelimit's
// config file: the same domain and keys, its fixed windows with the
// limits of the quotad policies (qb-denied admits one check a year).
const peerConfigYAML = `domain: quotabench
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: denied
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: cold
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: lease-off
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
`

// startRatelimit starts envoyproxy/ratelimit's binary with its documented
// environment: the rules from a runtime directory under tmp, Redis over
// TCP at redisAddr, no statsd, gRPC, HTTP and debug ports on free loopback
// ports, and extra (KEY=VALUE, e.g. LOCAL_CACHE_SIZE_IN_BYTES) last. It
// returns once the gRPC port accepts connections.
func startRatelimit(name, bin, redisAddr, tmp string, extra []string) (*server, error) {
	root := filepath.Join(tmp, "ratelimit-"+name)
	dir := filepath.Join(root, "current", "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "quotabench.yaml"), []byte(peerConfigYAML), 0o644); err != nil {
		return nil, err
	}
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"RUNTIME_ROOT="+filepath.Join(root, "current"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, "USE_STATSD=false", "LOG_LEVEL=warn",
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(ports[0]),
		"HOST=127.0.0.1", "PORT="+strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(ports[2]))
	cmd.Env = append(cmd.Env, extra...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	s := &server{name: name, cmd: cmd, stdin: stdin, tail: &tailBuffer{}, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
	cmd.Stdout, cmd.Stderr = s.tail, s.tail
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	s.pid = cmd.Process.Pid
	s.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.exited) }()
	for deadline := time.Now().Add(startTimeout); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s exited before listening: %s", name, s.tail)
		default:
		}
		if c, err := net.Dial("tcp", s.addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("%s did not listen on %s within %s: %s", name, s.addr, startTimeout, s.tail)
		}
	}
	if err := s.dial(); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}
