package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
)

// config is everything quotad can be told, from defaults, then the config
// file, then QUOTAD_* environment variables, then flags.
type config struct {
	// Listen is the address the API listens on. Default ":8080".
	Listen string
	// Redis makes Redis the authoritative store (a URL, Cluster seeds or
	// Sentinel); none of them set means the embedded memory store.
	// Redis.Timeout defaults to redis.DefaultTimeout and
	// Redis.ConnectTimeout to redis.DefaultConnectTimeout.
	Redis redis.Config
	// Breaker configures the circuit breaker in front of Redis; the zero
	// value takes node's defaults (5 failures, probe every 250ms).
	Breaker node.BreakerConfig
	// KeyPrefix starts every Redis key. Default "quotad".
	KeyPrefix string
	// InlineLimits lets requests carry their own limit. Default true.
	InlineLimits bool
	// DefaultOnStoreError is the failure mode of policies that set none.
	// Default open.
	DefaultOnStoreError node.FailureMode
	// Policies are the configured policies.
	Policies []node.Policy
	// ShutdownTimeout bounds the graceful shutdown. Default 10s.
	ShutdownTimeout time.Duration
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// Lease sizes leases; the zero value takes node's defaults (horizon
	// 200ms, hold 500ms, max fraction 0.05).
	Lease node.LeaseConfig
	// DeniedCache sizes the hot denied-key cache; the zero value means
	// 100,000 entries.
	DeniedCache cache.DeniedConfig
	// MaxBatch bounds the checks in one CheckBatch; 0 means rpc's
	// default, 1000 (also the most allowed).
	MaxBatch int
	// MaxRequestBytes bounds one CheckBatch or ShouldRateLimit request
	// message (other calls': at most rpc.MaxCallRequestBytes); 0 means
	// rpc's default, 2 MiB.
	MaxRequestBytes int
	// MaxInlinePeriod bounds how long an inline limit's state may live;
	// 0 means rpc's default, 24h.
	MaxInlinePeriod time.Duration
	// MemoryMaxKeys bounds the embedded memory store's states; 0 means
	// node's default, 250,000.
	MemoryMaxKeys int
	// Server bounds the API's connections: timeouts and the connection
	// cap; zero fields take rpc's defaults (read timeout 30s, idle timeout
	// 2m, 10,000 connections).
	Server rpc.ServerConfig
	// Envoy configures Envoy's rate limit service; the zero value leaves it
	// unserved.
	Envoy rpc.EnvoyConfig
	// EnvoyDir is a directory of envoyproxy/ratelimit config files whose
	// domains Envoy's rate limit service serves beside Envoy's, reloaded
	// when they change; empty means none.
	EnvoyDir string
	// Telemetry says where traces go and whether /metrics is served.
	Telemetry telemetryConfig
	// Cluster makes the node a cluster member; the zero value runs
	// standalone.
	Cluster clusterConfig
	// Console is the web console at GET /. Default on, keys shown.
	Console consoleConfig
	// TLS makes the API port serve TLS; the zero value serves cleartext.
	TLS tlsConfig
	// AdminTokenFile holds the bearer token admin calls (Reset) require;
	// empty leaves them open.
	AdminTokenFile string
	// PprofAddr is where Go's profiler is served (host:port); empty, the
	// default, serves none.
	PprofAddr string
	// GRPCTransport is grpc-go (the default) or connect: what serves gRPC
	// on the API's port.
	GRPCTransport string
	// File is the config file the settings were read from; the zero value
	// when there is none.
	File configFile
}

// configFile names a config file and what was read from it.
type configFile struct {
	// Path is the file as given to --config.
	Path string
	// SHA256 is the hex SHA-256 of the bytes read, which sha256sum prints
	// for the same file.
	SHA256 string
}

func defaultConfig() config {
	return config{
		Listen:              ":8080",
		Redis:               redis.Config{Timeout: redis.DefaultTimeout, ConnectTimeout: redis.DefaultConnectTimeout},
		KeyPrefix:           "quotad",
		InlineLimits:        true,
		DefaultOnStoreError: node.FailOpen,
		ShutdownTimeout:     10 * time.Second,
		LogLevel:            "info",
		Telemetry:           defaultTelemetryConfig(),
		Console:             defaultConsoleConfig(),
		GRPCTransport:       grpcTransportGRPCGo,
	}
}

// nodeConfig and rpcConfig hand each package its part.
func (c config) nodeConfig() node.Config {
	return node.Config{
		KeyPrefix: c.KeyPrefix, Policies: c.Policies, DefaultFailureMode: c.DefaultOnStoreError,
		Lease: c.Lease, DeniedCache: c.DeniedCache, Breaker: c.Breaker,
	}
}

// usesRedis reports whether Redis, not the memory store, is the authority.
func (c config) usesRedis() bool {
	return c.Redis.URL != "" || len(c.Redis.ClusterAddrs) > 0 || len(c.Redis.SentinelAddrs) > 0
}

func (c config) rpcConfig() rpc.Config {
	return rpc.Config{DisableInlineLimits: !c.InlineLimits, MaxBatch: c.MaxBatch, MaxRequestBytes: c.MaxRequestBytes, MaxInlinePeriod: c.MaxInlinePeriod, Envoy: c.Envoy,
		DisableConsole: !c.Console.Enabled, HideKeys: !c.Console.ShowKeys}
}

// validate checks what no package checks for itself.
func (c config) validate() error {
	if c.Listen == "" {
		return errors.New("listen: must not be empty")
	}
	if c.Redis.Timeout <= 0 {
		return fmt.Errorf("redis timeout: %s must be > 0", c.Redis.Timeout)
	}
	if c.Redis.ConnectTimeout <= 0 {
		return fmt.Errorf("redis connect timeout: %s must be > 0", c.Redis.ConnectTimeout)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("shutdown timeout: %s must be > 0", c.ShutdownTimeout)
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		return err
	}
	if err := c.Telemetry.validate(); err != nil {
		return err
	}
	if err := c.TLS.validate(); err != nil {
		return err
	}
	if err := validateAdminToken(c.AdminTokenFile); err != nil {
		return err
	}
	if err := validatePprofAddr(c.PprofAddr); err != nil {
		return err
	}
	if err := validateGRPCTransport(c.GRPCTransport); err != nil {
		return err
	}
	if c.usesRedis() {
		if err := c.Redis.Validate(); err != nil {
			return err
		}
	} else if r := c.Redis; r.MasterName != "" || r.Username != "" || r.Password != "" || r.SentinelUsername != "" || r.SentinelPassword != "" || r.TLS || r.TLSCAFile != "" || r.DB != 0 {
		return errors.New("redis: credentials, TLS, db or a master name are set but no Redis is (set --redis, --redis-cluster or --redis-sentinel)")
	}
	if err := c.rpcConfig().Validate(); err != nil {
		return err
	}
	if err := c.Server.Validate(); err != nil {
		return err
	}
	if err := (memory.Config{MaxKeys: c.MemoryMaxKeys}).Validate(); err != nil {
		return err
	}
	if err := c.Cluster.validate(c.usesRedis()); err != nil {
		return err
	}
	return c.nodeConfig().Validate()
}

// fileConfig is the YAML config file, as yamlfile.go reads it: by the
// yaml tags, strictly (unknown fields are errors). A pointer is nil when
// the file does not set it.
type fileConfig struct {
	Listen              *string       `yaml:"listen"`
	Redis               *fileRedis    `yaml:"redis"`
	KeyPrefix           *string       `yaml:"key_prefix"`
	InlineLimits        *bool         `yaml:"inline_limits"`
	DefaultOnStoreError *string       `yaml:"default_on_store_error"`
	ShutdownTimeout     *yamlDuration `yaml:"shutdown_timeout"`
	LogLevel            *string       `yaml:"log_level"`
	Lease               *fileLease    `yaml:"lease"`
	DeniedCache         *fileDenied   `yaml:"denied_cache"`
	Breaker             *fileBreaker  `yaml:"breaker"`
	MaxBatch            *int          `yaml:"max_batch"`
	MaxRequestBytes     *int          `yaml:"max_request_bytes"`
	MaxInlinePeriod     *yamlDuration `yaml:"max_inline_period"`
	MemoryMaxKeys       *int          `yaml:"memory_max_keys"`
	ReadTimeout         *yamlDuration `yaml:"read_timeout"`
	IdleTimeout         *yamlDuration `yaml:"idle_timeout"`
	MaxConnections      *int          `yaml:"max_connections"`
	Policies            []filePolicy  `yaml:"policies"`
	Envoy               *fileEnvoy    `yaml:"envoy"`
	Tracing             *fileTracing  `yaml:"tracing"`
	Metrics             *bool         `yaml:"metrics"`
	Cluster             *fileCluster  `yaml:"cluster"`
	Console             *fileConsole  `yaml:"console"`
	TLS                 *fileTLS      `yaml:"tls"`
	AdminTokenFile      *string       `yaml:"admin_token_file"`
	PprofAddr           *string       `yaml:"pprof_addr"`
	GRPCTransport       *string       `yaml:"grpc_transport"`
}

type fileLease struct {
	Horizon     *yamlDuration `yaml:"horizon"`
	Hold        *yamlDuration `yaml:"hold"`
	MaxFraction *float64      `yaml:"max_fraction"`
	MaxKeys     *int          `yaml:"max_keys"`
}

type fileDenied struct {
	MaxEntries *int64 `yaml:"max_entries"`
	MaxBytes   *int64 `yaml:"max_bytes"`
}

type fileRedis struct {
	URL              *string       `yaml:"url"`
	Cluster          fileList      `yaml:"cluster"`
	Sentinel         fileList      `yaml:"sentinel"`
	Master           *string       `yaml:"master"`
	Username         *string       `yaml:"username"`
	Password         *string       `yaml:"password"`
	SentinelUsername *string       `yaml:"sentinel_username"`
	SentinelPassword *string       `yaml:"sentinel_password"`
	DB               *int          `yaml:"db"`
	TLS              *bool         `yaml:"tls"`
	TLSCAFile        *string       `yaml:"tls_ca_file"`
	Timeout          *yamlDuration `yaml:"timeout"`
	ConnectTimeout   *yamlDuration `yaml:"connect_timeout"`
}

type fileBreaker struct {
	Failures   *int          `yaml:"failures"`
	ProbeEvery *yamlDuration `yaml:"probe_every"`
}

type filePolicy struct {
	Name         string       `yaml:"name"`
	Algorithm    string       `yaml:"algorithm"`
	Limit        int64        `yaml:"limit"`
	Period       yamlDuration `yaml:"period"`
	Burst        int64        `yaml:"burst"`
	OnStoreError string       `yaml:"on_store_error"`
	Lease        string       `yaml:"lease"`
}

// yamlDuration is a duration written as Go does: "1s", "5m", "250ms".
type yamlDuration time.Duration

func (d *yamlDuration) decodeNode(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if n.Kind != yaml.ScalarNode || err != nil {
		return fmt.Errorf("invalid duration %s (write e.g. 500ms, 30s, 5m, 24h)", describeNode(n))
	}
	*d = yamlDuration(v)
	return nil
}

// loadFile applies the YAML file at path on top of c, records it in
// c.File, and returns where each of its fields stands.
func loadFile(c *config, path string) (*yamlDoc, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	sum := sha256.Sum256(raw)
	c.File = configFile{Path: path, SHA256: hex.EncodeToString(sum[:])}
	return parseFileDoc(c, path, raw)
}

// parseFile applies raw, the YAML text of the file at path, on top of c.
// Every error is a *fileError: it names path, and the line and the field
// where there are ones.
func parseFile(c *config, path string, raw []byte) error {
	_, err := parseFileDoc(c, path, raw)
	return err
}

// parseFileDoc is parseFile that also returns where each field stands,
// for errors found once environment and flags are applied too.
func parseFileDoc(c *config, path string, raw []byte) (*yamlDoc, error) {
	d := &yamlDoc{path: path, lines: map[string]int{}}
	root, err := d.parseYAML(raw)
	if err != nil {
		return nil, err
	}
	var f fileConfig
	if root != nil {
		if err := d.decode(root, "", reflect.ValueOf(&f).Elem(), 0); err != nil {
			return nil, err
		}
	}
	if err := f.apply(c, d); err != nil {
		return nil, err
	}
	if err := f.applyEnvoy(c); err != nil {
		return nil, d.fieldError("", err)
	}
	return d, nil
}

// fieldError is err, a problem with the settings under field (a section,
// a policy, or "" for the whole file), as a fileError at the line of the
// field err names. Validation errors of quotad's packages start with the
// field they are about ("limit: ...", "envoy.domains[0].domain: ..."),
// relative to field or from the top; that prefix becomes the fileError's
// Field.
func (d *yamlDoc) fieldError(field string, err error) *fileError {
	msg := err.Error()
	name, rest, ok := strings.Cut(msg, ": ")
	if ok && fieldPath.MatchString(name) {
		if field != "" && !strings.HasPrefix(name, field) {
			if name == "policy" && strings.HasPrefix(field, "policies[") {
				name = "name" // node names a policy's name "policy"
			}
			name = field + "." + name
		}
		line, _ := d.lineOf(name)
		return d.errorAt(line, name, trimmedError{rest, err})
	}
	if field == "" {
		// A message that names its setting in words (mergedFields).
		for _, m := range mergedFields {
			if rest, ok := strings.CutPrefix(msg, m.prefix+": "); ok {
				if line, at := d.lineOf(m.field); at == m.field {
					return d.errorAt(line, m.field, trimmedError{rest, err})
				}
				break
			}
		}
	}
	line, _ := d.lineOf(field)
	return d.errorAt(line, field, err)
}

// fieldPath matches a field as the file spells it: lease.hold,
// envoy.domains[0].descriptors[1].policy.
var fieldPath = regexp.MustCompile(`^[a-z_]+(\[\d+\])*(\.[a-z_]+(\[\d+\])*)*$`)

// trimmedError is err with its text shortened to msg (the field it named
// moved to the fileError); errors.Is still sees err.
type trimmedError struct {
	msg string
	err error
}

func (e trimmedError) Error() string { return e.msg }
func (e trimmedError) Unwrap() error { return e.err }

func (f fileConfig) apply(c *config, d *yamlDoc) error {
	setIf(&c.Listen, f.Listen)
	setIf(&c.KeyPrefix, f.KeyPrefix)
	setIf(&c.InlineLimits, f.InlineLimits)
	setIf(&c.LogLevel, f.LogLevel)
	setIf(&c.MaxBatch, f.MaxBatch)
	setIf(&c.MaxRequestBytes, f.MaxRequestBytes)
	setIf(&c.MemoryMaxKeys, f.MemoryMaxKeys)
	setIf(&c.Server.MaxConnections, f.MaxConnections)
	for _, d := range []struct {
		dst *time.Duration
		src *yamlDuration
	}{{&c.MaxInlinePeriod, f.MaxInlinePeriod}, {&c.Server.ReadTimeout, f.ReadTimeout}, {&c.Server.IdleTimeout, f.IdleTimeout}} {
		if d.src != nil {
			*d.dst = time.Duration(*d.src)
		}
	}
	setIf(&c.PprofAddr, f.PprofAddr)
	setIf(&c.GRPCTransport, f.GRPCTransport)
	f.Cluster.apply(&c.Cluster)
	f.Console.apply(&c.Console)
	f.TLS.apply(&c.TLS)
	setIf(&c.AdminTokenFile, f.AdminTokenFile)
	if f.ShutdownTimeout != nil {
		c.ShutdownTimeout = time.Duration(*f.ShutdownTimeout)
	}
	if r := f.Redis; r != nil {
		setIf(&c.Redis.URL, r.URL)
		if r.Cluster != nil {
			c.Redis.ClusterAddrs = r.Cluster
		}
		if r.Sentinel != nil {
			c.Redis.SentinelAddrs = r.Sentinel
		}
		setIf(&c.Redis.MasterName, r.Master)
		setIf(&c.Redis.Username, r.Username)
		setIf(&c.Redis.Password, r.Password)
		setIf(&c.Redis.SentinelUsername, r.SentinelUsername)
		setIf(&c.Redis.SentinelPassword, r.SentinelPassword)
		setIf(&c.Redis.DB, r.DB)
		setIf(&c.Redis.TLS, r.TLS)
		setIf(&c.Redis.TLSCAFile, r.TLSCAFile)
		if r.Timeout != nil {
			c.Redis.Timeout = time.Duration(*r.Timeout)
		}
		if r.ConnectTimeout != nil {
			c.Redis.ConnectTimeout = time.Duration(*r.ConnectTimeout)
		}
	}
	if b := f.Breaker; b != nil {
		setIf(&c.Breaker.Failures, b.Failures)
		if b.ProbeEvery != nil {
			c.Breaker.ProbeEvery = time.Duration(*b.ProbeEvery)
		}
	}
	if f.Lease != nil {
		if f.Lease.Horizon != nil {
			c.Lease.Horizon = time.Duration(*f.Lease.Horizon)
		}
		if f.Lease.Hold != nil {
			c.Lease.Hold = time.Duration(*f.Lease.Hold)
		}
		setIf(&c.Lease.MaxFraction, f.Lease.MaxFraction)
		setIf(&c.Lease.MaxKeys, f.Lease.MaxKeys)
	}
	if f.DeniedCache != nil {
		setIf(&c.DeniedCache.MaxEntries, f.DeniedCache.MaxEntries)
		setIf(&c.DeniedCache.MaxBytes, f.DeniedCache.MaxBytes)
	}
	f.applyTelemetry(c)
	if f.DefaultOnStoreError != nil {
		m, err := node.ParseFailureMode(*f.DefaultOnStoreError)
		if err != nil {
			return d.fieldError("default_on_store_error", err)
		}
		c.DefaultOnStoreError = m
	}
	seen := map[string]int{}
	for i, fp := range f.Policies {
		field := fmt.Sprintf("policies[%d]", i)
		p, err := fp.policy()
		if err != nil {
			return d.fieldError(field, err)
		}
		if first, dup := seen[p.Name]; dup {
			line, _ := d.lineOf(field + ".name")
			return d.errorAt(line, field+".name", fmt.Errorf("%w %q (first defined on line %d)", node.ErrDuplicatePolicy, p.Name, first))
		}
		seen[p.Name], _ = d.lineOf(field)
		c.Policies = append(c.Policies, p)
	}
	return nil
}

func (fp filePolicy) policy() (node.Policy, error) {
	if fp.Algorithm == "" {
		return node.Policy{}, errors.New("algorithm: missing")
	}
	a, err := algorithms.ParseAlgorithm(fp.Algorithm)
	if err != nil {
		return node.Policy{}, fmt.Errorf("algorithm: %w", err)
	}
	p := node.Policy{
		Name:  fp.Name,
		Limit: algorithms.Limit{Algorithm: a, Limit: fp.Limit, Period: time.Duration(fp.Period), Burst: fp.Burst},
	}
	if fp.OnStoreError != "" {
		if p.OnStoreError, err = node.ParseFailureMode(fp.OnStoreError); err != nil {
			return node.Policy{}, fmt.Errorf("on_store_error: %w", err)
		}
	}
	if fp.Lease != "" {
		if p.Lease, err = node.ParseLeaseMode(fp.Lease); err != nil {
			return node.Policy{}, err
		}
	}
	if err := p.Validate(); err != nil {
		return node.Policy{}, err
	}
	return p, nil
}

func setIf[T any](dst *T, src *T) {
	if src != nil {
		*dst = *src
	}
}

// mergedFields maps how an error of the merged settings (validate) starts
// to the field of the config file it is about; the first match wins, so
// longer prefixes come first. The messages are those of validate and of
// the packages' Validate methods it calls.
var mergedFields = []struct{ prefix, field string }{
	{"listen", "listen"},
	{"redis timeout", "redis.timeout"},
	{"redis url", "redis.url"},
	{"redis cluster address", "redis.cluster"},
	{"redis sentinel address", "redis.sentinel"},
	{"redis master name", "redis.master"},
	{"redis sentinel credentials", "redis"},
	{"redis db", "redis.db"},
	{"redis tls ca file", "redis.tls_ca_file"},
	{"redis", "redis"},
	{"breaker failures", "breaker.failures"},
	{"breaker probe", "breaker.probe_every"},
	{"key_prefix", "key_prefix"},
	{"default failure mode", "default_on_store_error"},
	{"shutdown timeout", "shutdown_timeout"},
	{"log level", "log_level"},
	{"lease horizon", "lease.horizon"},
	{"lease hold", "lease.hold"},
	{"lease max fraction", "lease.max_fraction"},
	{"denied cache: max entries and max bytes", "denied_cache"},
	{"denied cache: max entries", "denied_cache.max_entries"},
	{"denied cache: max bytes", "denied_cache.max_bytes"},
	{"max batch", "max_batch"},
	{"max request bytes", "max_request_bytes"},
	{"trace exporter", "tracing.exporter"},
	{"trace endpoint", "tracing.endpoint"},
	{"trace sample ratio", "tracing.sample_ratio"},
	{"cluster bind address", "cluster.addr"},
	{"cluster advertise address", "cluster.advertise"},
	{"cluster node name", "cluster.node_name"},
	{"cluster key", "cluster.key_file"},
	{"cluster dead after", "cluster.dead_after"},
	{"cluster rejoin interval", "cluster.rejoin_interval"},
	{"join[", "cluster.join"},
	{"cluster", "cluster"},
	{"envoy near limit ratio", "envoy.near_limit_ratio"},
}

// mergedError is err, a problem validate found once file, environment and
// flags were merged. When it concerns a section of the config file doc and
// no flag or environment variable of that section was applied (overrides
// holds the names of those that were), it is a fileError at the field's
// line; otherwise it reads "config: ...", naming the setting.
func mergedError(err error, doc *yamlDoc, overrides map[string]bool) error {
	if doc != nil {
		msg := err.Error()
		for _, m := range mergedFields {
			if !strings.HasPrefix(msg, m.prefix) {
				continue
			}
			line, field := doc.lineOf(m.field)
			section, _, _ := strings.Cut(m.field, ".")
			if line == 0 || overridden(section, overrides) {
				break
			}
			if rest, ok := strings.CutPrefix(msg, m.prefix+": "); ok && field == m.field {
				// The field replaces the message's own name for it.
				return doc.errorAt(line, field, trimmedError{rest, err})
			}
			return doc.errorAt(line, field, err)
		}
	}
	return fmt.Errorf("config: %w", err)
}

// overridden reports whether a flag or environment variable in overrides
// sets part of the file's section.
func overridden(section string, overrides map[string]bool) bool {
	for name := range overrides {
		if settingSection(name) == section {
			return true
		}
	}
	return false
}

// settingSection is the config file's top-level key of the setting (flag)
// name: redis-timeout → redis, join → cluster, max-batch → max_batch.
func settingSection(name string) string {
	for _, p := range []struct{ prefix, section string }{
		{"redis", "redis"}, {"breaker-", "breaker"}, {"lease-", "lease"}, {"denied-cache-", "denied_cache"},
		{"trace-", "tracing"}, {"cluster-", "cluster"}, {"join", "cluster"}, {"node-name", "cluster"}, {"envoy-", "envoy"},
	} {
		if strings.HasPrefix(name, p.prefix) {
			return p.section
		}
	}
	return strings.ReplaceAll(name, "-", "_")
}
