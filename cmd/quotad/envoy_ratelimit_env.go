package main

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
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
