package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/node/store/memcache"
)

// This file reads envoyproxy/ratelimit's environment for `quotad
// envoy-ratelimit`: every variable that project documents is either
// translated into quotad's settings, accepted as having nothing to do in
// quotad (and said so at start), or refused with a line that says why and
// what to do. No variable upstream documents is ignored without a word.

// ratelimitEnv is envoyproxy/ratelimit's environment translated into a
// quotad run.
type ratelimitEnv struct {
	// args are quotad's flags.
	args []string
	// env overlays the process environment for quotad (e.g.
	// QUOTAD_REDIS_PASSWORD, OTEL_SERVICE_NAME): secrets stay out of args.
	env map[string]string
	// httpListen is upstream's HTTP port (HOST:PORT): /healthcheck, /json
	// and the whole API; metricsListen and metricsPath upstream's
	// Prometheus endpoint, when USE_PROMETHEUS is true.
	httpListen, metricsListen, metricsPath string
	// notes say, one line each, what quotad does instead of an upstream
	// setting or default that has nothing to do here.
	notes []string
}

// ratelimitDefaults are upstream's defaults (src/settings/settings.go), by
// variable; a variable left unset takes its default here as there.
var ratelimitDefaults = map[string]string{
	"HOST": "0.0.0.0", "PORT": "8080", "DEBUG_HOST": "0.0.0.0", "DEBUG_PORT": "6070",
	"GRPC_HOST": "0.0.0.0", "GRPC_PORT": "8081", "LOG_LEVEL": "WARN", "LOG_FORMAT": "text",
	"GRPC_MAX_CONNECTION_AGE": "24h", "GRPC_MAX_CONNECTION_AGE_GRACE": "1h",
	"CONFIG_TYPE": "FILE", "RUNTIME_ROOT": "/srv/runtime_data/current", "RUNTIME_APPDIRECTORY": "config",
	"USE_STATSD": "true", "PROMETHEUS_ADDR": ":9090", "PROMETHEUS_PATH": "/metrics",
	"STATSD_HOST": "localhost", "STATSD_PORT": "8125", "STATS_FLUSH_INTERVAL": "10s",
	// STATSD_PROTOCOL is lyft/gostats's, which upstream's statsd sink reads
	// from the environment itself.
	"STATSD_PROTOCOL":  "tcp",
	"NEAR_LIMIT_RATIO": "0.8", "BACKEND_TYPE": "redis", "MEMCACHE_MAX_IDLE_CONNS": "2",
	"REDIS_SOCKET_TYPE": "unix", "REDIS_TYPE": "SINGLE", "REDIS_URL": "/var/run/nutcracker/ratelimit.sock",
	"CONFIG_GRPC_XDS_NODE_ID": "default", "CONFIG_GRPC_XDS_SERVER_URL": "localhost:18000",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "3s",
	"TRACING_SERVICE_NAME":                          "RateLimit", "TRACING_EXPORTER_PROTOCOL": "http", "TRACING_SAMPLING_RATE": "1",
	"LIMIT_LIMIT_HEADER": "RateLimit-Limit", "LIMIT_REMAINING_HEADER": "RateLimit-Remaining", "LIMIT_RESET_HEADER": "RateLimit-Reset",
}

// ratelimitNoOps are variables whose setting has nothing to do in quotad,
// with what quotad does instead; setting one is accepted and the line is
// said at start.
var ratelimitNoOps = map[string]string{
	"REDIS_POOL_SIZE":                          "quotad pipelines every check over a few connections of its own; it has no pool to size",
	"REDIS_PIPELINE_WINDOW":                    "quotad batches Redis calls by itself (--redis-batch-window)",
	"REDIS_PIPELINE_LIMIT":                     "quotad batches Redis calls by itself (--redis-batch-window)",
	"REDIS_CLUSTER_PIPELINE_PARALLELISM":       "quotad pipelines to every Redis Cluster shard in parallel",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR":             "quotad has no connection pool to run empty",
	"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION":     "quotad's circuit breaker probes Redis and /healthcheck reports it",
	"REDIS_STARTUP_INITIAL_INTERVAL":           "quotad starts at once and its circuit breaker reconnects to Redis",
	"REDIS_STARTUP_MAX_INTERVAL":               "quotad starts at once and its circuit breaker reconnects to Redis",
	"REDIS_STARTUP_MAX_ELAPSED_TIME":           "quotad starts at once and its circuit breaker reconnects to Redis",
	"EXPIRATION_JITTER_MAX_SECONDS":            "quotad's counters expire with their window; a restart keeps them",
	"RUNTIME_WATCH_ROOT":                       "quotad watches the config directory's files themselves, each config reload atomic",
	"PROMETHEUS_MAPPER_YAML":                   "quotad names its Prometheus metrics itself (docs/envoy.md, Statistics)",
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "quotad's durations are seconds, as Prometheus recommends",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED":  "quotad is healthy with no rules loaded, as upstream by default; a directory that does not load stops quotad at start",
	"FORCE_START_WITHOUT_INITIAL_CONFIG":       "quotad starts with an empty or missing set of rules files",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL":      "quotad dials the xDS management server again every CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL, with jitter",
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL":          "quotad dials the xDS management server again every CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL, with jitter",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR":         "quotad dials the xDS management server again every CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL, with jitter",
	"XDS_CLIENT_BACKOFF_JITTER":                "quotad dials the xDS management server again every CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL, with jitter",
	"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES":         "quotad takes xDS responses of up to 4 MiB, the most rules it reads from a directory",
	"GOSTATS_FLUSH_INTERVAL_SECONDS":           "envoyproxy/ratelimit flushes its statistics every STATS_FLUSH_INTERVAL, which quotad reads",
	"TRACING_SERVICE_NAMESPACE":                "set OTEL_RESOURCE_ATTRIBUTES=service.namespace=... instead",
	"TRACING_SERVICE_INSTANCE_ID":              "set OTEL_RESOURCE_ATTRIBUTES=service.instance.id=... instead",
}

// ratelimitRefusals are settings quotad cannot honour, by variable: the
// value (lower case) that is refused ("" for any value set) and why. None
// today: every variable upstream documents is translated or not needed;
// values that cannot be translated are refused where they are read.
var ratelimitRefusals = []struct{ name, value, why string }{}

// ratelimitHonoured are the variables translate reads; with the no-ops and
// the refusals, every variable upstream documents (TestRatelimitEnvKnowsEveryVariable).
var ratelimitHonoured = []string{
	"HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT", "GRPC_HOST", "GRPC_PORT", "GRPC_UDS", "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE",
	"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN",
	"LOG_LEVEL", "LOG_FORMAT", "CONFIG_TYPE",
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES",
	"USE_STATSD", "USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "STATSD_HOST", "STATSD_PORT", "STATSD_PROTOCOL",
	"STATS_FLUSH_INTERVAL", "EXTRA_TAGS", "DISABLE_STATS", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH",
	"LOCAL_CACHE_SIZE_IN_BYTES", "NEAR_LIMIT_RATIO", "BACKEND_TYPE", "SHADOW_MODE", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
	"MEMCACHE_HOST_PORT", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_TLS", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY",
	"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	"QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA", "MERGE_DOMAIN_CONFIG",
	"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_TLS",
	"REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "REDIS_TIMEOUT", "REDIS_PERSECOND", "CACHE_KEY_PREFIX",
	"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE",
	"LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER",
	"CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
}

// ratelimitFamilies are prefixes of variables that only matter with a
// setting refused or unused above: the per-second Redis (REDIS_PERSECOND).
// Setting one is accepted, as upstream accepts it, and said at start.
var ratelimitFamilies = []struct{ prefix, note string }{
	{"REDIS_PERSECOND_", "quotad keeps every limit in the Redis of REDIS_URL, per-second ones too"},
}

// memcacheVariables are the settings of upstream's memcached, not needed
// with BACKEND_TYPE=redis.
var memcacheVariables = []string{"MEMCACHE_HOST_PORT", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_TLS", "MEMCACHE_TLS_CACERT",
	"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION"}

// ratelimitMinLocalCache is the smallest local cache upstream's freecache
// makes, whatever LOCAL_CACHE_SIZE_IN_BYTES asks for (512 KiB).
const ratelimitMinLocalCache = 512 * 1024

// translateRatelimitEnv reads upstream's variables from environ
// (KEY=VALUE, as os.Environ).
func translateRatelimitEnv(environ []string) (ratelimitEnv, error) {
	vars := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	getenv := func(name string) string { return vars[name] }
	var out ratelimitEnv
	out.env = map[string]string{}
	value := func(name string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return ratelimitDefaults[name]
	}
	set := func(name string) bool { return getenv(name) != "" }
	boolean := func(name string) (bool, error) {
		v := value(name)
		if v == "" {
			return false, nil
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("%s=%q: want true or false", name, v)
		}
		return b, nil
	}
	var problems []string
	fail := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }

	for _, r := range ratelimitRefusals {
		v := strings.ToLower(getenv(r.name))
		if v != "" && (r.value == "" || v == r.value || (r.value == "true" && v == "1")) {
			fail("%s=%s: %s", r.name, getenv(r.name), r.why)
		}
	}
	// With memcached, every REDIS_* variable set gets one note (memcache).
	onMemcache := strings.ToLower(value("BACKEND_TYPE")) == "memcache"
	redisAside := func(name string) bool { return onMemcache && strings.HasPrefix(name, "REDIS_") }
	for name, note := range ratelimitNoOps {
		if set(name) && !redisAside(name) {
			out.notes = append(out.notes, fmt.Sprintf("%s is not needed: %s", name, note))
		}
	}
	for name, v := range vars {
		for _, f := range ratelimitFamilies {
			if strings.HasPrefix(name, f.prefix) && v != "" && !redisAside(name) {
				out.notes = append(out.notes, fmt.Sprintf("%s is not needed: %s", name, f.note))
			}
		}
	}

	// Ports: gRPC is quotad's one API port; the HTTP port serves the API
	// too, with upstream's /healthcheck and /json. GRPC_UDS puts the gRPC
	// port on a Unix socket instead of GRPC_HOST:GRPC_PORT, as upstream.
	if uds := getenv("GRPC_UDS"); uds != "" {
		out.args = append(out.args, "--listen", unixListenPrefix+uds)
		for _, name := range []string{"GRPC_HOST", "GRPC_PORT"} {
			if set(name) {
				out.notes = append(out.notes, name+" is not needed: GRPC_UDS serves the gRPC port on "+uds+" instead")
			}
		}
	} else {
		out.args = append(out.args, "--listen", net.JoinHostPort(value("GRPC_HOST"), value("GRPC_PORT")))
	}
	if err := out.connectionAge(value, set); err != nil {
		fail("%v", err)
	}
	out.httpListen = net.JoinHostPort(value("HOST"), value("PORT"))
	out.args = append(out.args, "--pprof-addr", net.JoinHostPort(value("DEBUG_HOST"), value("DEBUG_PORT")))
	if tls, err := boolean("GRPC_SERVER_USE_TLS"); err != nil {
		fail("%v", err)
	} else if tls {
		if !set("GRPC_SERVER_TLS_CERT") || !set("GRPC_SERVER_TLS_KEY") {
			fail("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
		}
		out.args = append(out.args, "--tls-cert-file", getenv("GRPC_SERVER_TLS_CERT"), "--tls-key-file", getenv("GRPC_SERVER_TLS_KEY"))
		if set("GRPC_CLIENT_TLS_CACERT") {
			out.args = append(out.args, "--tls-client-ca-file", getenv("GRPC_CLIENT_TLS_CACERT"))
		}
	}
	// Upstream checks the name only of a client certificate its CA
	// verified; set without one, it would check nothing.
	if san := getenv("GRPC_CLIENT_TLS_SAN"); san != "" {
		if tls, _ := boolean("GRPC_SERVER_USE_TLS"); !tls || !set("GRPC_CLIENT_TLS_CACERT") {
			fail("GRPC_CLIENT_TLS_SAN=%s needs GRPC_SERVER_USE_TLS=true and GRPC_CLIENT_TLS_CACERT: the name is checked on client certificates that CA signed", san)
		} else {
			out.args = append(out.args, "--tls-client-san", san)
		}
	}

	switch f := strings.ToLower(value("LOG_FORMAT")); f {
	case "text", "json":
		out.args = append(out.args, "--log-format", f)
	default:
		fail("LOG_FORMAT=%q: want text or json", value("LOG_FORMAT"))
	}
	if p := getenv("CACHE_KEY_PREFIX"); p != "" {
		// quotad's keys are not upstream's: the windows in progress start
		// afresh whatever the prefix.
		out.args = append(out.args, "--key-prefix", p)
	}
	if per, err := boolean("REDIS_PERSECOND"); err != nil {
		fail("%v", err)
	} else if per && !onMemcache {
		out.notes = append(out.notes, "REDIS_PERSECOND is not needed: quotad keeps every limit in the Redis of REDIS_URL, per-second ones too")
	}
	switch l := strings.ToLower(value("LOG_LEVEL")); l {
	case "trace", "debug":
		out.args = append(out.args, "--log-level", "debug")
	case "info", "warn", "error":
		out.args = append(out.args, "--log-level", l)
	case "warning":
		out.args = append(out.args, "--log-level", "warn")
	case "fatal", "panic":
		out.args = append(out.args, "--log-level", "error")
	default:
		fail("LOG_LEVEL=%q: want trace, debug, info, warn, error, fatal or panic", value("LOG_LEVEL"))
	}

	// Rules: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, as
	// upstream's file provider reads them, or an xDS management server.
	switch strings.ToUpper(value("CONFIG_TYPE")) {
	case "FILE":
		out.args = append(out.args, "--envoy-config-dir", filepath.Join(value("RUNTIME_ROOT"), value("RUNTIME_SUBDIRECTORY"), value("RUNTIME_APPDIRECTORY")))
		for _, kv := range environ {
			if name, v, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "CONFIG_GRPC_XDS_") && v != "" {
				out.notes = append(out.notes, name+" is not needed: used only with CONFIG_TYPE=GRPC_XDS_SOTW")
			}
		}
	case "GRPC_XDS_SOTW":
		if err := out.xds(value, set, boolean); err != nil {
			fail("%v", err)
		}
	default:
		fail("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", value("CONFIG_TYPE"))
	}
	if _, err := boolean("RUNTIME_IGNOREDOTFILES"); err != nil {
		fail("%v", err)
	} else if set("RUNTIME_IGNOREDOTFILES") {
		out.notes = append(out.notes, "RUNTIME_IGNOREDOTFILES is not needed: quotad reads the *.yaml and *.yml files of the directory and never a name starting with a dot")
	}
	if ratio := value("NEAR_LIMIT_RATIO"); set("NEAR_LIMIT_RATIO") {
		out.args = append(out.args, "--envoy-near-limit-ratio", ratio)
	}
	for _, f := range [][2]string{{"QUOTA_MODE", "--envoy-quota-mode"}, {"RESPONSE_DYNAMIC_METADATA", "--envoy-dynamic-metadata"}, {"MERGE_DOMAIN_CONFIG", "--envoy-merge-domains"}} {
		if on, err := boolean(f[0]); err != nil {
			fail("%v", err)
		} else if on {
			out.args = append(out.args, f[1])
		}
	}
	if stop, err := boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"); err != nil {
		fail("%v", err)
	} else if stop {
		out.args = append(out.args, "--envoy-stop-increment-when-over-limit")
	}
	if shadow, err := boolean("SHADOW_MODE"); err != nil {
		fail("%v", err)
	} else if shadow {
		out.args = append(out.args, "--envoy-shadow-mode")
	}
	if v := getenv("LOCAL_CACHE_SIZE_IN_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil || n < 0:
			fail("LOCAL_CACHE_SIZE_IN_BYTES=%q: want a number of bytes", v)
		case n > 0:
			out.args = append(out.args, "--denied-cache-bytes", strconv.FormatInt(max(n, ratelimitMinLocalCache), 10))
			if n < ratelimitMinLocalCache {
				out.notes = append(out.notes, fmt.Sprintf("LOCAL_CACHE_SIZE_IN_BYTES=%d: the denied-key cache holds %d bytes, the least upstream's cache holds too", n, ratelimitMinLocalCache))
			}
		}
	}

	// Metrics and traces.
	if err := out.stats(value, set, boolean); err != nil {
		fail("%v", err)
	}
	if prom, err := boolean("USE_PROMETHEUS"); err != nil {
		fail("%v", err)
	} else if prom {
		out.metricsListen, out.metricsPath = value("PROMETHEUS_ADDR"), value("PROMETHEUS_PATH")
		if !strings.HasPrefix(out.metricsPath, "/") {
			fail("PROMETHEUS_PATH=%q: want a path starting with /", out.metricsPath)
		}
	}
	if tracing, err := boolean("TRACING_ENABLED"); err != nil {
		fail("%v", err)
	} else if tracing {
		switch p := strings.ToLower(value("TRACING_EXPORTER_PROTOCOL")); p {
		case "http":
			out.args = append(out.args, "--trace-exporter", "otlp-http")
		case "grpc":
			out.args = append(out.args, "--trace-exporter", "otlp-grpc")
		default:
			fail("TRACING_EXPORTER_PROTOCOL=%q: want http or grpc", p)
		}
		out.args = append(out.args, "--trace-sample-ratio", value("TRACING_SAMPLING_RATE"))
		out.env["OTEL_SERVICE_NAME"] = value("TRACING_SERVICE_NAME")
	}
	if headers, err := boolean("LIMIT_RESPONSE_HEADERS_ENABLED"); err != nil {
		fail("%v", err)
	} else if headers {
		out.args = append(out.args, "--envoy-response-headers", "--envoy-response-header-names",
			value("LIMIT_LIMIT_HEADER")+","+value("LIMIT_REMAINING_HEADER")+","+value("LIMIT_RESET_HEADER"))
	} else {
		for _, h := range []string{"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"} {
			if set(h) {
				out.notes = append(out.notes, h+" is not needed: used only with LIMIT_RESPONSE_HEADERS_ENABLED=true")
			}
		}
	}

	switch b := strings.ToLower(value("BACKEND_TYPE")); b {
	case "redis":
		for _, name := range memcacheVariables {
			if set(name) {
				out.notes = append(out.notes, name+" is not needed: used only with BACKEND_TYPE=memcache")
			}
		}
		if err := out.redis(value, set, boolean); err != nil {
			fail("%v", err)
		}
	case "memcache":
		for name, v := range vars {
			if strings.HasPrefix(name, "REDIS_") && v != "" {
				out.notes = append(out.notes, name+" is not needed: used only with BACKEND_TYPE=redis")
			}
		}
		if err := out.memcache(value, set, boolean); err != nil {
			fail("%v", err)
		}
	default:
		fail("BACKEND_TYPE=%q: want redis or memcache", value("BACKEND_TYPE"))
	}
	if len(problems) > 0 {
		return ratelimitEnv{}, fmt.Errorf("envoy-ratelimit: quotad cannot run with this environment:\n  %s", strings.Join(problems, "\n  "))
	}
	slices.Sort(out.notes)
	return out, nil
}

// redis translates REDIS_*: one server over TCP or a Unix socket, Sentinel
// (REDIS_URL "master,host:port,...") or Cluster (REDIS_URL
// "host:port,..."), with REDIS_AUTH ("password" or "user:password") and
// REDIS_TLS with its CA, client certificate and host name check.
func (out *ratelimitEnv) redis(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	tls, err := boolean("REDIS_TLS")
	if err != nil {
		return err
	}
	if set("REDIS_TLS_CACERT") {
		if !tls {
			return fmt.Errorf("REDIS_TLS_CACERT needs REDIS_TLS=true")
		}
		out.args = append(out.args, "--redis-tls-ca", value("REDIS_TLS_CACERT"))
	}
	// Upstream presents a client certificate when both files are set;
	// quotad refuses one without the other rather than leave it unused.
	if set("REDIS_TLS_CLIENT_CERT") || set("REDIS_TLS_CLIENT_KEY") {
		switch {
		case !tls:
			return fmt.Errorf("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY need REDIS_TLS=true")
		case !set("REDIS_TLS_CLIENT_CERT") || !set("REDIS_TLS_CLIENT_KEY"):
			return fmt.Errorf("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together: set both, or neither")
		}
		out.args = append(out.args, "--redis-tls-cert-file", value("REDIS_TLS_CLIENT_CERT"), "--redis-tls-key-file", value("REDIS_TLS_CLIENT_KEY"))
	}
	// As upstream, the chain is still verified, against REDIS_TLS_CACERT
	// (or the system's roots), only the host name is not.
	if skip, err := boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"); err != nil {
		return err
	} else if skip {
		if !tls {
			return fmt.Errorf("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true needs REDIS_TLS=true")
		}
		out.args = append(out.args, "--redis-tls-skip-hostname-verification")
	}
	if set("REDIS_TIMEOUT") {
		d, err := time.ParseDuration(value("REDIS_TIMEOUT"))
		if err != nil || d <= 0 {
			return fmt.Errorf("REDIS_TIMEOUT=%q: want a duration such as 10s", value("REDIS_TIMEOUT"))
		}
		out.args = append(out.args, "--redis-connect-timeout", d.String())
		out.notes = append(out.notes, "REDIS_TIMEOUT bounds opening a Redis connection (--redis-connect-timeout); a check waits at most --redis-timeout (50ms) for its reply, and a failing Redis opens the circuit breaker")
	}
	user, password := "", value("REDIS_AUTH")
	if u, p, ok := strings.Cut(password, ":"); ok {
		user, password = u, p
	}
	addrs := strings.Split(value("REDIS_URL"), ",")
	for i := range addrs {
		addrs[i] = strings.TrimSpace(addrs[i])
	}
	socket := strings.ToLower(value("REDIS_SOCKET_TYPE"))
	if socket != "tcp" && socket != "unix" {
		return fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", value("REDIS_SOCKET_TYPE"))
	}
	t := strings.ToLower(value("REDIS_TYPE"))
	if set("REDIS_SENTINEL_AUTH") && t != "sentinel" {
		out.notes = append(out.notes, "REDIS_SENTINEL_AUTH is not needed: used only with REDIS_TYPE=sentinel")
	}
	switch t {
	case "single":
		u := &url.URL{Scheme: "redis", Host: addrs[0], Path: "/0"}
		if tls {
			u.Scheme = "rediss"
		}
		if socket == "unix" {
			if tls {
				return fmt.Errorf("REDIS_TLS=true over REDIS_SOCKET_TYPE=unix: TLS needs tcp")
			}
			u = &url.URL{Scheme: "unix", Path: addrs[0]}
		}
		if len(addrs) != 1 || addrs[0] == "" {
			return fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=single wants one address", value("REDIS_URL"))
		}
		if password != "" {
			u.User = url.UserPassword(user, password)
		}
		out.args = append(out.args, "--redis", u.String())
		return nil
	case "sentinel", "cluster":
		if socket != "tcp" {
			return fmt.Errorf("REDIS_TYPE=%s needs REDIS_SOCKET_TYPE=tcp", t)
		}
		if user != "" {
			out.args = append(out.args, "--redis-username", user)
		}
		if password != "" {
			out.env["QUOTAD_REDIS_PASSWORD"] = password
		}
		if tls {
			out.args = append(out.args, "--redis-tls")
		}
		if t == "cluster" {
			out.args = append(out.args, "--redis-cluster", strings.Join(addrs, ","))
			return nil
		}
		if len(addrs) < 2 {
			return fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=sentinel wants the master's name, then the sentinels (mymaster,host:port,host:port)", value("REDIS_URL"))
		}
		out.args = append(out.args, "--redis-master", addrs[0], "--redis-sentinel", strings.Join(addrs[1:], ","))
		if a := value("REDIS_SENTINEL_AUTH"); a != "" {
			su, sp := "", a
			if u, p, ok := strings.Cut(a, ":"); ok {
				su, sp = u, p
			}
			if su != "" {
				out.args = append(out.args, "--redis-sentinel-username", su)
			}
			out.env["QUOTAD_REDIS_SENTINEL_PASSWORD"] = sp
		}
		return nil
	default:
		return fmt.Errorf("REDIS_TYPE=%q: want single, sentinel or cluster", value("REDIS_TYPE"))
	}
}

// memcache translates BACKEND_TYPE=memcache: MEMCACHE_HOST_PORT's
// servers (host:port,host:port, in the order that spreads the keys, as
// upstream's gomemcache spreads them) into --memcache, or MEMCACHE_SRV
// (memcacheServers),
// MEMCACHE_MAX_IDLE_CONNS (upstream's 2 by default; 0 or less is
// gomemcache's default, 2) into --memcache-max-idle-conns, and
// MEMCACHE_TLS with its CA, client certificate and host name check into
// --memcache-tls and its files.
func (out *ratelimitEnv) memcache(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	if err := out.memcacheTLS(value, set, boolean); err != nil {
		return err
	}
	if err := out.memcacheServers(value, set); err != nil {
		return err
	}
	n, err := strconv.Atoi(value("MEMCACHE_MAX_IDLE_CONNS"))
	if err != nil {
		return fmt.Errorf("MEMCACHE_MAX_IDLE_CONNS=%q: want a number of connections, e.g. 2", value("MEMCACHE_MAX_IDLE_CONNS"))
	}
	if n <= 0 {
		out.notes = append(out.notes, fmt.Sprintf("MEMCACHE_MAX_IDLE_CONNS=%d: quotad keeps %d idle connections per server, as upstream's memcached client does for 0 or less", n, memcache.DefaultMaxIdleConns))
		n = memcache.DefaultMaxIdleConns
	}
	out.args = append(out.args, "--memcache-max-idle-conns", strconv.Itoa(n))
	return nil
}

// memcacheServers translates MEMCACHE_HOST_PORT into --memcache, or
// MEMCACHE_SRV and MEMCACHE_SRV_REFRESH (0, upstream's default, looks it
// up once) into --memcache-srv and --memcache-srv-refresh. As upstream,
// one of the first two, not both.
func (out *ratelimitEnv) memcacheServers(value func(string) string, set func(string) bool) error {
	hosts, srv := value("MEMCACHE_HOST_PORT"), value("MEMCACHE_SRV")
	switch {
	case hosts != "" && srv != "":
		return fmt.Errorf("MEMCACHE_HOST_PORT and MEMCACHE_SRV are both set: set one, as upstream")
	case srv != "":
		if err := (memcache.Config{SRV: srv}).Validate(); err != nil {
			return fmt.Errorf("MEMCACHE_SRV=%q: %w", srv, err)
		}
		out.args = append(out.args, "--memcache-srv", srv)
		if set("MEMCACHE_SRV_REFRESH") {
			d, err := time.ParseDuration(value("MEMCACHE_SRV_REFRESH"))
			if err != nil || d < 0 {
				return fmt.Errorf("MEMCACHE_SRV_REFRESH=%q: want a duration such as 30s (0 looks the record up once)", value("MEMCACHE_SRV_REFRESH"))
			}
			if d > 0 {
				out.args = append(out.args, "--memcache-srv-refresh", d.String())
			}
		}
		return nil
	case hosts == "":
		return fmt.Errorf("BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT (memcached's servers, host:port,host:port) or MEMCACHE_SRV (an SRV record that lists them)")
	}
	if set("MEMCACHE_SRV_REFRESH") {
		out.notes = append(out.notes, "MEMCACHE_SRV_REFRESH is not needed: used only with MEMCACHE_SRV")
	}
	addrs := strings.Split(hosts, ",")
	for i := range addrs {
		addrs[i] = strings.TrimSpace(addrs[i])
	}
	if err := (memcache.Config{Addrs: addrs}).Validate(); err != nil {
		return fmt.Errorf("MEMCACHE_HOST_PORT=%q: %w", hosts, err)
	}
	out.args = append(out.args, "--memcache", strings.Join(addrs, ","))
	return nil
}

// memcacheTLS translates MEMCACHE_TLS and its files. Upstream reads the
// files only with MEMCACHE_TLS=true; quotad refuses them without it, as it
// refuses REDIS_TLS's, rather than leave them unused.
func (out *ratelimitEnv) memcacheTLS(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	tls, err := boolean("MEMCACHE_TLS")
	if err != nil {
		return err
	}
	skip, err := boolean("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION")
	if err != nil {
		return err
	}
	files := set("MEMCACHE_TLS_CACERT") || set("MEMCACHE_TLS_CLIENT_CERT") || set("MEMCACHE_TLS_CLIENT_KEY") || skip
	if !tls {
		if files {
			return fmt.Errorf("MEMCACHE_TLS_CACERT, MEMCACHE_TLS_CLIENT_CERT, MEMCACHE_TLS_CLIENT_KEY and MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION need MEMCACHE_TLS=true")
		}
		return nil
	}
	out.args = append(out.args, "--memcache-tls")
	if set("MEMCACHE_TLS_CACERT") {
		out.args = append(out.args, "--memcache-tls-ca", value("MEMCACHE_TLS_CACERT"))
	}
	if set("MEMCACHE_TLS_CLIENT_CERT") || set("MEMCACHE_TLS_CLIENT_KEY") {
		if !set("MEMCACHE_TLS_CLIENT_CERT") || !set("MEMCACHE_TLS_CLIENT_KEY") {
			return fmt.Errorf("MEMCACHE_TLS_CLIENT_CERT and MEMCACHE_TLS_CLIENT_KEY go together: set both, or neither")
		}
		out.args = append(out.args, "--memcache-tls-cert-file", value("MEMCACHE_TLS_CLIENT_CERT"), "--memcache-tls-key-file", value("MEMCACHE_TLS_CLIENT_KEY"))
	}
	if skip {
		out.args = append(out.args, "--memcache-tls-skip-hostname-verification")
	}
	return nil
}

// xds translates CONFIG_GRPC_XDS_*: the rules from an xDS management
// server (--envoy-xds-*).
func (out *ratelimitEnv) xds(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	out.args = append(out.args, "--envoy-xds-server", value("CONFIG_GRPC_XDS_SERVER_URL"), "--envoy-xds-node-id", value("CONFIG_GRPC_XDS_NODE_ID"))
	if m := value("CONFIG_GRPC_XDS_NODE_METADATA"); m != "" {
		out.args = append(out.args, "--envoy-xds-node-metadata", m)
	}
	if h := value("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"); h != "" {
		// Upstream's maps are "name:value,name:value".
		pairs := strings.Split(h, ",")
		for i, p := range pairs {
			k, v, ok := strings.Cut(p, ":")
			if !ok {
				return fmt.Errorf("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=%q: want name:value,name:value", h)
			}
			pairs[i] = k + "=" + v
		}
		out.args = append(out.args, "--envoy-xds-headers", strings.Join(pairs, ","))
	}
	d, err := time.ParseDuration(value("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"))
	if err != nil || d <= 0 {
		return fmt.Errorf("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=%q: want a duration such as 3s", value("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"))
	}
	out.args = append(out.args, "--envoy-xds-retry-interval", d.String())
	tls, err := boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS")
	if err != nil {
		return err
	}
	if !tls {
		return nil
	}
	out.args = append(out.args, "--envoy-xds-tls")
	for _, f := range [][2]string{{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--envoy-xds-tls-ca-file"},
		{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "--envoy-xds-tls-cert-file"}, {"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "--envoy-xds-tls-key-file"},
		{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "--envoy-xds-tls-server-name"}} {
		if set(f[0]) {
			out.args = append(out.args, f[1], value(f[0]))
		}
	}
	return nil
}

// statsdVariables are the settings of upstream's statsd sinks.
var statsdVariables = []string{"STATSD_HOST", "STATSD_PORT", "STATSD_PROTOCOL", "STATS_FLUSH_INTERVAL", "EXTRA_TAGS", "USE_DOG_STATSD_MOGRIFIERS"}

// stats translates upstream's statistics sinks: statsd (USE_STATSD, true
// by default, to STATSD_HOST:STATSD_PORT over lyft/gostats's
// STATSD_PROTOCOL, tcp by default) or DogStatsD (USE_DOG_STATSD, over
// UDP), every STATS_FLUSH_INTERVAL, with EXTRA_TAGS; DISABLE_STATS sends
// none (--statsd-*). Upstream allows one sink of statsd, DogStatsD and
// Prometheus; quotad serves Prometheus beside either when both are asked
// for.
func (out *ratelimitEnv) stats(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	var on [4]bool
	for i, name := range []string{"DISABLE_STATS", "USE_STATSD", "USE_DOG_STATSD", "USE_PROMETHEUS"} {
		b, err := boolean(name)
		if err != nil {
			return err
		}
		on[i] = b
	}
	disabled, statsd, dog, prom := on[0], on[1], on[2], on[3]
	notNeeded := func(why string) {
		for _, name := range statsdVariables {
			if set(name) {
				out.notes = append(out.notes, name+" is not needed: "+why)
			}
		}
	}
	switch {
	case disabled && prom:
		return fmt.Errorf("DISABLE_STATS=true and USE_PROMETHEUS=true: upstream serves no statistics at all with DISABLE_STATS; unset one")
	case disabled:
		notNeeded("DISABLE_STATS=true sends no statistics")
		return nil
	case dog && statsd && set("USE_STATSD"):
		return fmt.Errorf("USE_DOG_STATSD=true and USE_STATSD=true: set one, as upstream (DogStatsD is statsd with tags)")
	case !dog && statsd && prom && !set("USE_STATSD"):
		out.notes = append(out.notes, "USE_STATSD defaults to true upstream, which refuses it beside USE_PROMETHEUS=true: quotad sends no statsd; set USE_STATSD=true to send it as well")
		statsd = false
	}
	if !statsd && !dog {
		notNeeded("used only with USE_STATSD=true or USE_DOG_STATSD=true")
		return nil
	}
	port, err := strconv.ParseUint(value("STATSD_PORT"), 10, 16)
	if err != nil || port == 0 {
		return fmt.Errorf("STATSD_PORT=%q: want a port number, 1 to 65535", value("STATSD_PORT"))
	}
	out.args = append(out.args, "--statsd-addr", net.JoinHostPort(value("STATSD_HOST"), strconv.FormatUint(port, 10)))
	protocol := strings.ToLower(value("STATSD_PROTOCOL"))
	switch {
	case dog:
		// Upstream's DogStatsD client sends datagrams whatever
		// STATSD_PROTOCOL says.
		protocol = statsdUDP
		if set("STATSD_PROTOCOL") {
			out.notes = append(out.notes, "STATSD_PROTOCOL is not needed: DogStatsD is sent over UDP, as upstream sends it")
		}
		out.args = append(out.args, "--statsd-dogstatsd")
	case protocol != statsdTCP && protocol != statsdUDP:
		return fmt.Errorf("STATSD_PROTOCOL=%q: want tcp or udp", value("STATSD_PROTOCOL"))
	}
	out.args = append(out.args, "--statsd-protocol", protocol)
	d, err := time.ParseDuration(value("STATS_FLUSH_INTERVAL"))
	if err != nil || d <= 0 {
		return fmt.Errorf("STATS_FLUSH_INTERVAL=%q: want a duration such as 10s", value("STATS_FLUSH_INTERVAL"))
	}
	out.args = append(out.args, "--statsd-flush-interval", d.String())
	if tags := value("EXTRA_TAGS"); tags != "" {
		if _, err := parseStatsdTags(tags); err != nil {
			return fmt.Errorf("EXTRA_TAGS=%q: want key:value,key:value", tags)
		}
		out.args = append(out.args, "--statsd-tags", tags)
	}
	if set("USE_DOG_STATSD_MOGRIFIERS") {
		if !dog {
			out.notes = append(out.notes, "USE_DOG_STATSD_MOGRIFIERS is not needed: used only with USE_DOG_STATSD=true")
			return nil
		}
		m, err := dogStatsdMogrifiers(value("USE_DOG_STATSD_MOGRIFIERS"), value)
		if err != nil {
			return err
		}
		out.args = append(out.args, "--statsd-mogrifiers", m)
	}
	return nil
}

// dogStatsdMogrifiers reads upstream's mogrifiers, named in list
// (USE_DOG_STATSD_MOGRIFIERS, "A,B"), each from its
// DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS
// ("key:template,key:template"), as its src/godogstats reads them, into
// --statsd-mogrifiers' JSON.
func dogStatsdMogrifiers(list string, value func(string) string) (string, error) {
	var specs []statsdMogrifierSpec
	for _, key := range strings.Split(list, ",") {
		key = strings.TrimSpace(key)
		if key == "" {
			continue
		}
		prefix := "DOG_STATSD_MOGRIFIER_" + strings.ToUpper(key) + "_"
		sp := statsdMogrifierSpec{Pattern: value(prefix + "PATTERN"), Name: value(prefix + "NAME")}
		if sp.Pattern == "" || sp.Name == "" {
			return "", fmt.Errorf("USE_DOG_STATSD_MOGRIFIERS names %s: set %sPATTERN and %sNAME", key, prefix, prefix)
		}
		if tags := value(prefix + "TAGS"); tags != "" {
			sp.Tags = map[string]string{}
			for _, kv := range strings.Split(tags, ",") {
				k, v, ok := strings.Cut(kv, ":")
				if !ok || k == "" || v == "" {
					return "", fmt.Errorf("%sTAGS=%q: want key:template,key:template", prefix, tags)
				}
				sp.Tags[k] = v
			}
		}
		specs = append(specs, sp)
	}
	text, err := json.Marshal(specs)
	if err != nil {
		return "", err
	}
	if _, err := parseStatsdMogrifiers(string(text)); err != nil {
		return "", fmt.Errorf("USE_DOG_STATSD_MOGRIFIERS=%s: %w", list, err)
	}
	return string(text), nil
}

// connectionAge translates GRPC_MAX_CONNECTION_AGE and
// GRPC_MAX_CONNECTION_AGE_GRACE (upstream's defaults 24h and 1h, which
// grpc-go applies to its connections) into --max-connection-age and
// --max-connection-age-grace, which quotad applies to every connection of
// the gRPC port. 0 never ages them out, as in grpc-go.
func (out *ratelimitEnv) connectionAge(value func(string) string, set func(string) bool) error {
	var d [2]time.Duration
	for i, name := range []string{"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE"} {
		v, err := time.ParseDuration(value(name))
		if err != nil || v < 0 {
			return fmt.Errorf("%s=%q: want a duration such as 24h (0 for never)", name, value(name))
		}
		d[i] = v
	}
	if d[0] == 0 {
		if set("GRPC_MAX_CONNECTION_AGE_GRACE") {
			out.notes = append(out.notes, "GRPC_MAX_CONNECTION_AGE_GRACE is not needed: GRPC_MAX_CONNECTION_AGE=0 never ages connections out")
		}
		return nil
	}
	out.args = append(out.args, "--max-connection-age", d[0].String())
	if d[1] > 0 {
		out.args = append(out.args, "--max-connection-age-grace", d[1].String())
	}
	return nil
}
