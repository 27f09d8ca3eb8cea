package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
	commonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// upstreamVariables are the environment variables envoyproxy/ratelimit
// reads (its src/settings/settings.go at commit f2fb157, 2026-07-05).
var upstreamVariables = strings.Fields(`HOST PORT DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_HOST GRPC_PORT
GRPC_MAX_CONNECTION_AGE GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS GRPC_SERVER_TLS_CERT
GRPC_SERVER_TLS_KEY GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN LOG_LEVEL LOG_FORMAT CONFIG_TYPE
FORCE_START_WITHOUT_INITIAL_CONFIG CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA
CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS CONFIG_GRPC_XDS_SERVER_USE_TLS CONFIG_GRPC_XDS_CLIENT_TLS_CERT
CONFIG_GRPC_XDS_CLIENT_TLS_KEY CONFIG_GRPC_XDS_SERVER_TLS_CACERT CONFIG_GRPC_XDS_SERVER_TLS_SAN
XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL XDS_CLIENT_BACKOFF_RANDOM_FACTOR
XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS
USE_STATSD STATSD_HOST STATSD_PORT EXTRA_TAGS STATS_FLUSH_INTERVAL DISABLE_STATS USE_PROMETHEUS
PROMETHEUS_ADDR PROMETHEUS_PATH PROMETHEUS_MAPPER_YAML PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS
RUNTIME_ROOT RUNTIME_SUBDIRECTORY RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES RUNTIME_WATCH_ROOT
EXPIRATION_JITTER_MAX_SECONDS LOCAL_CACHE_SIZE_IN_BYTES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX BACKEND_TYPE
STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT LIMIT_RESPONSE_HEADERS_ENABLED LIMIT_LIMIT_HEADER
LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED REDIS_SOCKET_TYPE
REDIS_TYPE REDIS_URL REDIS_POOL_SIZE REDIS_AUTH REDIS_TLS REDIS_TLS_CLIENT_CERT REDIS_TLS_CLIENT_KEY
REDIS_TLS_CACERT REDIS_TLS_SKIP_HOSTNAME_VERIFICATION REDIS_PIPELINE_WINDOW REDIS_PIPELINE_LIMIT
REDIS_CLUSTER_PIPELINE_PARALLELISM REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE REDIS_PERSECOND_TYPE
REDIS_PERSECOND_URL REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH REDIS_PERSECOND_TLS
REDIS_SENTINEL_AUTH REDIS_PERSECOND_SENTINEL_AUTH REDIS_PERSECOND_PIPELINE_WINDOW
REDIS_PERSECOND_PIPELINE_LIMIT REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM
REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT REDIS_PERSECOND_TIMEOUT REDIS_POOL_ON_EMPTY_BEHAVIOR
REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR REDIS_STARTUP_INITIAL_INTERVAL REDIS_STARTUP_MAX_INTERVAL
REDIS_STARTUP_MAX_ELAPSED_TIME MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV
MEMCACHE_SRV_REFRESH MEMCACHE_TLS MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT
MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION SHADOW_MODE QUOTA_MODE RESPONSE_DYNAMIC_METADATA
MERGE_DOMAIN_CONFIG TRACING_ENABLED TRACING_SERVICE_NAME TRACING_SERVICE_NAMESPACE
TRACING_SERVICE_INSTANCE_ID TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE`)

// Every variable upstream reads is translated, accepted as not needed
// (and said so), or refused: none is passed over without a word.
func TestRatelimitEnvKnowsEveryVariable(t *testing.T) {
	if len(upstreamVariables) != 114 {
		t.Fatalf("%d upstream variables listed, want the 114 of its settings", len(upstreamVariables))
	}
	for _, v := range upstreamVariables {
		known := slices.Contains(ratelimitHonoured, v) || ratelimitNoOps[v] != ""
		known = known || slices.ContainsFunc(ratelimitRefusals, func(r struct{ name, value, why string }) bool { return r.name == v })
		known = known || slices.ContainsFunc(ratelimitFamilies, func(f struct{ prefix, note string }) bool { return strings.HasPrefix(v, f.prefix) })
		if !known {
			t.Errorf("%s: neither translated, accepted as not needed, nor refused", v)
		}
	}
	// docs/envoy.md's table names each, or its family (MEMCACHE_*).
	page, err := os.ReadFile("../../docs/envoy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(page), "| upstream variables | what quotad does |")
	table, _, _ = strings.Cut(table, "\n\n")
	for _, v := range upstreamVariables {
		named := strings.Contains(table, "`"+v+"`") || strings.Contains(table, "`"+v+"=")
		for _, f := range ratelimitFamilies {
			named = named || (strings.HasPrefix(v, f.prefix) && strings.Contains(table, "`"+f.prefix+"*`"))
		}
		if !named {
			t.Errorf("docs/envoy.md's table of upstream's variables does not name %s", v)
		}
	}
}

func TestRatelimitEnvTranslates(t *testing.T) {
	for _, c := range []struct {
		name  string
		env   []string
		args  string // quotad flags, joined by spaces
		env2  map[string]string
		notes []string
		// without is a flag the args must not hold.
		without  string
		problems []string
	}{
		{name: "upstream's defaults", env: nil,
			args: "--listen 0.0.0.0:8081 --max-connection-age 24h0m0s --max-connection-age-grace 1h0m0s --pprof-addr 0.0.0.0:6070 --log-format text --log-level warn --envoy-config-dir /srv/runtime_data/current/config --statsd-addr localhost:8125 --statsd-protocol tcp --statsd-flush-interval 10s --redis unix:///var/run/nutcracker/ratelimit.sock"},
		{name: "connection age", env: []string{"USE_STATSD=false", "GRPC_MAX_CONNECTION_AGE=5m", "GRPC_MAX_CONNECTION_AGE_GRACE=0"},
			args: "--listen 0.0.0.0:8081 --max-connection-age 5m0s --pprof-addr"},
		{name: "connection age off", env: []string{"USE_STATSD=false", "GRPC_MAX_CONNECTION_AGE=0", "GRPC_MAX_CONNECTION_AGE_GRACE=1m"},
			args:  "--listen 0.0.0.0:8081 --pprof-addr",
			notes: []string{"GRPC_MAX_CONNECTION_AGE_GRACE is not needed: GRPC_MAX_CONNECTION_AGE=0 never ages connections out"}},
		{name: "connection age refused", env: []string{"USE_STATSD=false", "GRPC_MAX_CONNECTION_AGE=a day"},
			problems: []string{`GRPC_MAX_CONNECTION_AGE="a day": want a duration such as 24h (0 for never)`}},
		{name: "statsd", env: []string{"STATSD_HOST=statsd", "STATSD_PORT=9125", "STATSD_PROTOCOL=udp", "STATS_FLUSH_INTERVAL=2s", "EXTRA_TAGS=env:prod,team:edge"},
			args: "--statsd-addr statsd:9125 --statsd-protocol udp --statsd-flush-interval 2s --statsd-tags env:prod,team:edge"},
		{name: "dogstatsd", env: []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "STATSD_PROTOCOL=tcp", "EXTRA_TAGS=env:prod"},
			args:  "--statsd-addr localhost:8125 --statsd-dogstatsd --statsd-protocol udp --statsd-flush-interval 10s --statsd-tags env:prod",
			notes: []string{"STATSD_PROTOCOL is not needed: DogStatsD is sent over UDP"}},
		{name: "dogstatsd mogrifiers", env: []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "USE_DOG_STATSD_MOGRIFIERS=hits",
			`DOG_STATSD_MOGRIFIER_HITS_PATTERN=^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
			"DOG_STATSD_MOGRIFIER_HITS_NAME=ratelimit.service.rate_limit.$3", "DOG_STATSD_MOGRIFIER_HITS_TAGS=domain:$1,descriptor:$2"},
			args: `--statsd-mogrifiers [{"pattern":"^ratelimit\\.service\\.rate_limit\\.([^.]+)\\.(.*)\\.([^.]+)$","name":"ratelimit.service.rate_limit.$3","tags":{"descriptor":"$2","domain":"$1"}}]`},
		{name: "dogstatsd mogrifier without its pattern", env: []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "USE_DOG_STATSD_MOGRIFIERS=hits", "DOG_STATSD_MOGRIFIER_HITS_NAME=x"},
			problems: []string{"USE_DOG_STATSD_MOGRIFIERS names hits: set DOG_STATSD_MOGRIFIER_HITS_PATTERN and DOG_STATSD_MOGRIFIER_HITS_NAME"}},
		{name: "dogstatsd mogrifier with a bad pattern", env: []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "USE_DOG_STATSD_MOGRIFIERS=a", "DOG_STATSD_MOGRIFIER_A_PATTERN=(", "DOG_STATSD_MOGRIFIER_A_NAME=x"},
			problems: []string{`USE_DOG_STATSD_MOGRIFIERS=a: mogrifier 1: pattern "(": error parsing regexp`}},
		{name: "prometheus instead of statsd's default", env: []string{"USE_PROMETHEUS=true", "STATSD_PORT=9125"},
			args: "--envoy-config-dir /srv/runtime_data/current/config --redis",
			notes: []string{"STATSD_PORT is not needed: used only with USE_STATSD=true or USE_DOG_STATSD=true",
				"USE_STATSD defaults to true upstream, which refuses it beside USE_PROMETHEUS=true: quotad sends no statsd"}},
		{name: "statistics disabled", env: []string{"DISABLE_STATS=true", "STATSD_HOST=statsd"},
			args:  "--envoy-config-dir /srv/runtime_data/current/config --redis",
			notes: []string{"STATSD_HOST is not needed: DISABLE_STATS=true sends no statistics"}},
		{name: "statistics refused", env: []string{"DISABLE_STATS=true", "USE_PROMETHEUS=true", "STATS_FLUSH_INTERVAL=soon"},
			problems: []string{"DISABLE_STATS=true and USE_PROMETHEUS=true: upstream serves no statistics at all with DISABLE_STATS; unset one"}},
		{name: "statsd refused", env: []string{"USE_STATSD=true", "USE_DOG_STATSD=true"},
			problems: []string{"USE_DOG_STATSD=true and USE_STATSD=true: set one, as upstream"}},
		{name: "statsd settings refused", env: []string{"STATSD_PORT=statsd", "STATS_FLUSH_INTERVAL=soon"},
			problems: []string{`STATSD_PORT="statsd": want a port number, 1 to 65535`}},
		{name: "statsd flush interval refused", env: []string{"STATS_FLUSH_INTERVAL=soon"},
			problems: []string{`STATS_FLUSH_INTERVAL="soon": want a duration such as 10s`}},
		{name: "statsd tags refused", env: []string{"EXTRA_TAGS=prod", "STATSD_PROTOCOL=quic"},
			problems: []string{`STATSD_PROTOCOL="quic": want tcp or udp`}},
		{name: "statsd extra tags refused", env: []string{"EXTRA_TAGS=prod"},
			problems: []string{`EXTRA_TAGS="prod": want key:value,key:value`}},
		{name: "docker compose", env: []string{"USE_STATSD=false", "LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=redis:6379",
			"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "MEMCACHE_HOST_PORT=memcached:11211"},
			args:  "--listen 0.0.0.0:8081 --max-connection-age 24h0m0s --max-connection-age-grace 1h0m0s --pprof-addr 0.0.0.0:6070 --log-format text --log-level debug --envoy-config-dir /data/ratelimit/config --redis redis://redis:6379/0",
			notes: []string{"MEMCACHE_HOST_PORT is not needed: used only with BACKEND_TYPE=memcache"}},
		{name: "password and TLS", env: []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6380", "REDIS_AUTH=s3cret", "REDIS_TLS=true", "REDIS_TLS_CACERT=/ca.pem", "USE_STATSD=false"},
			args: "--redis-tls-ca /ca.pem --redis rediss://:s3cret@r:6380/0"},
		{name: "redis client certificate", env: []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r:6380", "REDIS_TLS=true", "REDIS_TLS_CLIENT_CERT=/c.pem", "REDIS_TLS_CLIENT_KEY=/k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true", "USE_STATSD=false"},
			args: "--redis-tls-cert-file /c.pem --redis-tls-key-file /k.pem --redis-tls-skip-hostname-verification --redis rediss://r:6380/0"},
		{name: "redis client certificate without TLS", env: []string{"REDIS_TLS_CLIENT_CERT=/c.pem", "REDIS_TLS_CLIENT_KEY=/k.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true", "USE_STATSD=false"},
			problems: []string{"REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY need REDIS_TLS=true"}},
		{name: "redis client certificate without its key", env: []string{"REDIS_TLS=true", "REDIS_SOCKET_TYPE=tcp", "REDIS_TLS_CLIENT_CERT=/c.pem", "USE_STATSD=false"},
			problems: []string{"REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together: set both, or neither"}},
		{name: "client certificate name", env: []string{"USE_STATSD=false", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_CLIENT_TLS_CACERT=/ca", "GRPC_CLIENT_TLS_SAN=envoy.internal"},
			args: "--tls-cert-file /c --tls-key-file /k --tls-client-ca-file /ca --tls-client-san envoy.internal"},
		{name: "client certificate name without its CA", env: []string{"USE_STATSD=false", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k", "GRPC_CLIENT_TLS_SAN=envoy.internal"},
			problems: []string{"GRPC_CLIENT_TLS_SAN=envoy.internal needs GRPC_SERVER_USE_TLS=true and GRPC_CLIENT_TLS_CACERT"}},
		{name: "sentinel", env: []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=sentinel", "REDIS_URL=mymaster,s1:26379,s2:26379", "REDIS_AUTH=u:p", "REDIS_SENTINEL_AUTH=sp", "USE_STATSD=false"},
			args: "--redis-username u --redis-master mymaster --redis-sentinel s1:26379,s2:26379",
			env2: map[string]string{"QUOTAD_REDIS_PASSWORD": "p", "QUOTAD_REDIS_SENTINEL_PASSWORD": "sp"}},
		{name: "cluster", env: []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=CLUSTER", "REDIS_URL=a:7000, b:7000", "REDIS_TLS=true", "USE_STATSD=false"},
			args: "--redis-tls --redis-cluster a:7000,b:7000"},
		{name: "settings", env: []string{"USE_STATSD=false", "SHADOW_MODE=true", "NEAR_LIMIT_RATIO=0.9", "LOCAL_CACHE_SIZE_IN_BYTES=1000", "REDIS_POOL_SIZE=20",
			"TRACING_ENABLED=true", "TRACING_EXPORTER_PROTOCOL=grpc", "TRACING_SAMPLING_RATE=0.1", "GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=/c", "GRPC_SERVER_TLS_KEY=/k"},
			args: "--tls-cert-file /c --tls-key-file /k --log-format text --log-level warn --envoy-config-dir /srv/runtime_data/current/config --envoy-near-limit-ratio 0.9 --envoy-shadow-mode --denied-cache-bytes 524288 --trace-exporter otlp-grpc --trace-sample-ratio 0.1",
			env2: map[string]string{"OTEL_SERVICE_NAME": "RateLimit"},
			notes: []string{"LOCAL_CACHE_SIZE_IN_BYTES=1000: the denied-key cache holds 524288 bytes",
				"REDIS_POOL_SIZE is not needed: quotad pipelines every check"}},
		{name: "xds", env: []string{"USE_STATSD=false", "CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID=test-node-id",
			"CONFIG_GRPC_XDS_SERVER_URL=xds:18000", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS=authorization:Bearer t,x-team:edge",
			"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=/ca", "CONFIG_GRPC_XDS_SERVER_TLS_SAN=xds.internal", "XDS_CLIENT_BACKOFF_MAX_INTERVAL=30s"},
			args:  "--envoy-xds-server xds:18000 --envoy-xds-node-id test-node-id --envoy-xds-headers authorization=Bearer t,x-team=edge --envoy-xds-retry-interval 3s --envoy-xds-tls --envoy-xds-tls-ca-file /ca --envoy-xds-tls-server-name xds.internal",
			notes: []string{"XDS_CLIENT_BACKOFF_MAX_INTERVAL is not needed"}},
		{name: "unix socket", env: []string{"USE_STATSD=false", "GRPC_UDS=/run/rl.sock", "GRPC_PORT=9081"},
			args:  "--listen unix:/run/rl.sock --max-connection-age 24h0m0s --max-connection-age-grace 1h0m0s --pprof-addr",
			notes: []string{"GRPC_PORT is not needed: GRPC_UDS serves the gRPC port on /run/rl.sock instead"}},
		{name: "refusals", env: []string{"CONFIG_TYPE=GRPC", "LOG_LEVEL=loud", "REDIS_TYPE=ring", "LOG_FORMAT=xml"},
			problems: []string{`CONFIG_TYPE="GRPC": want FILE or GRPC_XDS_SOTW`,
				`LOG_LEVEL="loud"`, `REDIS_TYPE="ring": want single, sentinel or cluster`, `LOG_FORMAT="xml"`}},
		{name: "memcache", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=mc-0:11211, mc-1:11211", "REDIS_URL=redis:6379", "REDIS_POOL_SIZE=10"},
			args:    "--log-level warn --envoy-config-dir /srv/runtime_data/current/config --memcache mc-0:11211,mc-1:11211 --memcache-max-idle-conns 2",
			notes:   []string{"REDIS_POOL_SIZE is not needed: used only with BACKEND_TYPE=redis", "REDIS_URL is not needed: used only with BACKEND_TYPE=redis"},
			without: "--redis"},
		{name: "memcache idle connections", env: []string{"USE_STATSD=false", "BACKEND_TYPE=MEMCACHE", "MEMCACHE_HOST_PORT=mc:11211", "MEMCACHE_MAX_IDLE_CONNS=0"},
			args:  "--memcache mc:11211 --memcache-max-idle-conns 2",
			notes: []string{"MEMCACHE_MAX_IDLE_CONNS=0: quotad keeps 2 idle connections per server, as upstream's memcached client does for 0 or less"}},
		{name: "memcache needs servers", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache"},
			problems: []string{"BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT (memcached's servers, host:port,host:port) or MEMCACHE_SRV (an SRV record that lists them)"}},
		{name: "memcache srv", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_SRV=_memcache._tcp.example", "MEMCACHE_SRV_REFRESH=30s"},
			args: "--memcache-srv _memcache._tcp.example --memcache-srv-refresh 30s --memcache-max-idle-conns 2"},
		{name: "memcache srv and servers", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_SRV=_memcache._tcp.example", "MEMCACHE_HOST_PORT=mc:11211"},
			problems: []string{"MEMCACHE_HOST_PORT and MEMCACHE_SRV are both set: set one, as upstream"}},
		{name: "memcache srv malformed", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_SRV=memcache.example", "MEMCACHE_SRV_REFRESH=often"},
			problems: []string{`MEMCACHE_SRV="memcache.example": invalid memcache config: SRV record "memcache.example": want _service._proto.name`}},
		{name: "memcache srv refresh refused", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_SRV=_memcache._tcp.example", "MEMCACHE_SRV_REFRESH=often"},
			problems: []string{`MEMCACHE_SRV_REFRESH="often": want a duration such as 30s (0 looks the record up once)`}},
		{name: "memcache bad server", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=mc", "MEMCACHE_MAX_IDLE_CONNS=many"},
			problems: []string{`MEMCACHE_HOST_PORT="mc": invalid memcache config: server "mc": want host:port, e.g. memcached:11211`}},
		{name: "memcache idle connections refused", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=mc:11211", "MEMCACHE_MAX_IDLE_CONNS=many"},
			problems: []string{`MEMCACHE_MAX_IDLE_CONNS="many": want a number of connections, e.g. 2`}},
		{name: "memcache tls", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=mc:11211", "MEMCACHE_TLS=true",
			"MEMCACHE_TLS_CACERT=/ca.pem", "MEMCACHE_TLS_CLIENT_CERT=/c.pem", "MEMCACHE_TLS_CLIENT_KEY=/k.pem", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION=true"},
			args: "--memcache-tls --memcache-tls-ca /ca.pem --memcache-tls-cert-file /c.pem --memcache-tls-key-file /k.pem --memcache-tls-skip-hostname-verification --memcache mc:11211"},
		{name: "memcache tls files without tls", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=mc:11211", "MEMCACHE_TLS_CACERT=/ca.pem"},
			problems: []string{"MEMCACHE_TLS_CACERT, MEMCACHE_TLS_CLIENT_CERT, MEMCACHE_TLS_CLIENT_KEY and MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION need MEMCACHE_TLS=true"}},
		{name: "memcache client certificate without its key", env: []string{"USE_STATSD=false", "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT=mc:11211", "MEMCACHE_TLS=true", "MEMCACHE_TLS_CLIENT_CERT=/c.pem"},
			problems: []string{"MEMCACHE_TLS_CLIENT_CERT and MEMCACHE_TLS_CLIENT_KEY go together: set both, or neither"}},
		{name: "memcache settings on redis", env: []string{"USE_STATSD=false", "MEMCACHE_TLS=true", "MEMCACHE_TLS_CACERT=/ca.pem"},
			args:  "--redis unix:///var/run/nutcracker/ratelimit.sock",
			notes: []string{"MEMCACHE_TLS is not needed: used only with BACKEND_TYPE=memcache", "MEMCACHE_TLS_CACERT is not needed: used only with BACKEND_TYPE=memcache"}},
		{name: "backend refused", env: []string{"USE_STATSD=false", "BACKEND_TYPE=dynamodb"},
			problems: []string{`BACKEND_TYPE="dynamodb": want redis or memcache`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := translateRatelimitEnv(c.env)
			if len(c.problems) > 0 {
				if err == nil {
					t.Fatalf("accepted, want refused: %v", tr.args)
				}
				for _, p := range c.problems {
					if !strings.Contains(err.Error(), p) {
						t.Errorf("error %q does not say %q", err, p)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(tr.args, " "); !strings.Contains(got, c.args) {
				t.Errorf("args %q, want them to contain %q", got, c.args)
			}
			if c.without != "" && slices.Contains(tr.args, c.without) {
				t.Errorf("args %q hold %s", tr.args, c.without)
			}
			for k, v := range c.env2 {
				if tr.env[k] != v {
					t.Errorf("env %s=%q, want %q", k, tr.env[k], v)
				}
			}
			for _, n := range c.notes {
				if !slices.ContainsFunc(tr.notes, func(s string) bool { return strings.HasPrefix(s, n) }) {
					t.Errorf("notes %q, want one starting %q", tr.notes, n)
				}
			}
		})
	}
}

// freeTCPAddr returns a loopback port nothing listens on.
func freeTCPPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// `quotad envoy-ratelimit` with the environment of envoyproxy/ratelimit's
// docker-compose.yml (its Redis and rules directory moved to the test's,
// its ports to free ones, LOCAL_CACHE_SIZE_IN_BYTES=1000 from its
// integration settings) serves upstream's ports: /healthcheck, /json (OK,
// then 429 when over the limit), the gRPC service, the debug port's
// profiler and the Prometheus endpoint.
func TestEnvoyRatelimitServesUpstreamsPorts(t *testing.T) {
	r := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rules := "domain: rl\ndescriptors:\n  - key: category\n    value: account\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcPort, httpPort, debugPort, promPort := freeTCPPort(t), freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)
	cmd := exec.Command(quotadtest.Binary(t), "envoy-ratelimit")
	cmd.Env = []string{
		"USE_STATSD=false", "LOG_LEVEL=debug", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.Addr(),
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "MEMCACHE_HOST_PORT=memcached:11211",
		"LOCAL_CACHE_SIZE_IN_BYTES=1000", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:" + promPort,
		"HOST=127.0.0.1", "PORT=" + httpPort, "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort,
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + debugPort,
	}
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	base := "http://127.0.0.1:" + httpPort
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get(base + "/healthcheck"); err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 || string(body) != "OK" {
				t.Fatalf("/healthcheck: %d %q, want 200 OK", res.StatusCode, body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the HTTP port never answered:\n%s\n%s", stdout.tail(), stderr.tail())
		}
	}
	if !stderr.contains("MEMCACHE_HOST_PORT is not needed") {
		t.Errorf("the start does not say MEMCACHE_HOST_PORT is not needed:\n%s", stderr.tail())
	}

	ask := `{"domain":"rl","descriptors":[{"entries":[{"key":"category","value":"account"}]}]}`
	for i, want := range []int{200, 200, 429} {
		res, err := http.Post(base+"/json", "application/json", strings.NewReader(ask))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var answer struct {
			OverallCode string `json:"overallCode"`
			Statuses    []struct {
				LimitRemaining int `json:"limitRemaining"`
			} `json:"statuses"`
		}
		if err := json.Unmarshal(body, &answer); err != nil || res.StatusCode != want {
			t.Fatalf("/json %d: %d %s (%v), want %d", i+1, res.StatusCode, body, err, want)
		}
		if wantCode := map[int]string{200: "OK", 429: "OVER_LIMIT"}[want]; answer.OverallCode != wantCode {
			t.Errorf("/json %d: overallCode %s, want %s", i+1, answer.OverallCode, wantCode)
		}
	}
	if res, err := http.Post(base+"/json", "application/json", strings.NewReader("not json")); err != nil || res.StatusCode != 400 {
		t.Errorf("/json with a body that is not a request: %v %v, want 400", res, err)
	}

	// The gRPC port is quotad's API: Envoy's service, over the same
	// counters (the key is over its limit by now).
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var res rlsv3.RateLimitResponse
	req := &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "category", Value: "account"}}}}}
	if err := conn.Invoke(ctx, shouldRateLimitPath, req, &res); err != nil {
		t.Fatal(err)
	}
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("gRPC answered %v, want OVER_LIMIT", res.GetOverallCode())
	}

	for _, u := range []string{"http://127.0.0.1:" + debugPort + "/debug/pprof/", "http://127.0.0.1:" + promPort + "/metrics"} {
		res, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || (strings.HasSuffix(u, "/metrics") && !bytes.Contains(body, []byte("quotad_envoy"))) {
			t.Errorf("%s: %d, want 200 (and quotad's Envoy statistics on /metrics)", u, res.StatusCode)
		}
	}
}

// A variable quotad cannot honour stops it at start with the line that
// says why and what to do.
func TestEnvoyRatelimitRefusesWhatItCannotHonour(t *testing.T) {
	cmd := exec.Command(quotadtest.Binary(t), "envoy-ratelimit")
	cmd.Env = []string{"BACKEND_TYPE=memcache", "MEMCACHE_SRV=_memcache._tcp.example", "MEMCACHE_HOST_PORT=memcached:11211"}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("started with MEMCACHE_SRV and MEMCACHE_HOST_PORT:\n%s", out)
	}
	want := "MEMCACHE_HOST_PORT and MEMCACHE_SRV are both set: set one, as upstream"
	if !strings.Contains(string(out), want) {
		t.Errorf("output:\n%s\nwant the line %q", out, want)
	}
	cmd = exec.Command(quotadtest.Binary(t), "envoy-ratelimit", "--redis", "x")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "envoy-ratelimit takes no arguments") {
		t.Errorf("with flags: %v\n%s", err, out)
	}
}
