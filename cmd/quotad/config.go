package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc"
)

// config is everything quotad can be told, from defaults, then the config
// file, then QUOTAD_* environment variables, then flags.
type config struct {
	// Listen is the address the API listens on. Default ":8080".
	Listen string
	// Redis makes Redis the authoritative store (a URL, Cluster seeds or
	// Sentinel); none of them set means the embedded memory store.
	// Redis.Timeout defaults to node.DefaultRedisTimeout.
	Redis node.RedisConfig
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
	// MaxRequestBytes bounds one request message; 0 means rpc's default,
	// 4 MiB.
	MaxRequestBytes int
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
	// PprofAddr is where Go's profiler is served (host:port); empty, the
	// default, serves none.
	PprofAddr string
	// GRPCTransport is grpc-go (the default) or connect: what serves gRPC
	// on the API's port.
	GRPCTransport string
}

func defaultConfig() config {
	return config{
		Listen:              ":8080",
		Redis:               node.RedisConfig{Timeout: node.DefaultRedisTimeout},
		KeyPrefix:           "quotad",
		InlineLimits:        true,
		DefaultOnStoreError: node.FailOpen,
		ShutdownTimeout:     10 * time.Second,
		LogLevel:            "info",
		Telemetry:           defaultTelemetryConfig(),
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
	return rpc.Config{DisableInlineLimits: !c.InlineLimits, MaxBatch: c.MaxBatch, MaxRequestBytes: c.MaxRequestBytes, Envoy: c.Envoy}
}

// validate checks what no package checks for itself.
func (c config) validate() error {
	if c.Listen == "" {
		return errors.New("listen: must not be empty")
	}
	if c.Redis.Timeout <= 0 {
		return fmt.Errorf("redis timeout: %s must be > 0", c.Redis.Timeout)
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
	if err := c.Cluster.validate(c.usesRedis()); err != nil {
		return err
	}
	return c.nodeConfig().Validate()
}

// fileConfig is the YAML config file. Unknown fields are errors.
type fileConfig struct {
	Listen              *string        `yaml:"listen"`
	Redis               *fileRedis     `yaml:"redis"`
	KeyPrefix           *string        `yaml:"key_prefix"`
	InlineLimits        *bool          `yaml:"inline_limits"`
	DefaultOnStoreError *string        `yaml:"default_on_store_error"`
	ShutdownTimeout     *yamlDuration  `yaml:"shutdown_timeout"`
	LogLevel            *string        `yaml:"log_level"`
	Lease               *fileLease     `yaml:"lease"`
	DeniedCache         *fileDenied    `yaml:"denied_cache"`
	Breaker             *fileBreaker   `yaml:"breaker"`
	MaxBatch            *int           `yaml:"max_batch"`
	MaxRequestBytes     *int           `yaml:"max_request_bytes"`
	Policies            []filePolicyAt `yaml:"policies"`
	Envoy               *fileEnvoy     `yaml:"envoy"`
	Tracing             *fileTracing   `yaml:"tracing"`
	Metrics             *bool          `yaml:"metrics"`
	Cluster             *fileCluster   `yaml:"cluster"`
	PprofAddr           *string        `yaml:"pprof_addr"`
	GRPCTransport       *string        `yaml:"grpc_transport"`
}

type fileLease struct {
	Horizon     *yamlDuration `yaml:"horizon"`
	Hold        *yamlDuration `yaml:"hold"`
	MaxFraction *float64      `yaml:"max_fraction"`
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

// filePolicyAt remembers where a policy stands in the file, so errors about
// it can name the line.
type filePolicyAt struct {
	filePolicy
	line int
}

func (p *filePolicyAt) UnmarshalYAML(n *yaml.Node) error {
	p.line = n.Line
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a policy must be a mapping (name, algorithm, limit, period, ...)", n.Line)
	}
	// yaml.v3 does not carry KnownFields into custom unmarshalers, so the
	// policy's keys are checked here.
	for i := 0; i < len(n.Content); i += 2 {
		k := n.Content[i]
		if !policyFields[k.Value] {
			return fmt.Errorf("line %d: field %s not found in policy (known: name, algorithm, limit, period, burst, on_store_error, lease)", k.Line, k.Value)
		}
	}
	return n.Decode(&p.filePolicy)
}

var policyFields = map[string]bool{"name": true, "algorithm": true, "limit": true, "period": true, "burst": true, "on_store_error": true, "lease": true}

// unknownField is yaml.v3's message for a field the file structs lack.
var unknownField = regexp.MustCompile(`field (\S+) not found in type main\.file(\w+)`)

// yamlSections names the file structs as users write them.
var yamlSections = map[string]string{"Config": "the top level", "Redis": "redis", "Lease": "lease", "Denied": "denied_cache", "Breaker": "breaker"}

// yamlMessage is err's text without yaml.v3's line breaks and Go type
// names: "line 3: unknown field adress in redis".
func yamlMessage(err error) string {
	msg := strings.ReplaceAll(err.Error(), "\n ", "")
	msg = strings.TrimPrefix(msg, "yaml: unmarshal errors:")
	return unknownField.ReplaceAllStringFunc(msg, func(m string) string {
		sub := unknownField.FindStringSubmatch(m)
		section, ok := yamlSections[sub[2]]
		if !ok {
			section = sub[2]
		}
		return "unknown field " + sub[1] + " in " + section
	})
}

// yamlDuration is a duration written as Go does: "1s", "5m", "250ms".
type yamlDuration time.Duration

func (d *yamlDuration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: invalid duration %q (write e.g. 500ms, 30s, 5m, 24h)", n.Line, n.Value)
	}
	*d = yamlDuration(v)
	return nil
}

// loadFile applies the YAML file at path on top of c.
func loadFile(c *config, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return parseFile(c, path, raw)
}

// parseFile applies raw, the YAML text of the file at path, on top of c.
// Every error names path and, where the YAML parser knows it, the line.
func parseFile(c *config, path string, raw []byte) error {
	var f fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	// An empty file decodes as io.EOF: no settings.
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %s", path, yamlMessage(err))
	}
	// A second document would otherwise be ignored without a word.
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		line := more.Line
		if err != nil {
			return fmt.Errorf("config %s: %s", path, yamlMessage(err))
		}
		return fmt.Errorf("config %s: line %d: a second YAML document; put every setting in one", path, line)
	}
	if err := f.apply(c); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	if err := f.applyEnvoy(c); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

func (f fileConfig) apply(c *config) error {
	setIf(&c.Listen, f.Listen)
	setIf(&c.KeyPrefix, f.KeyPrefix)
	setIf(&c.InlineLimits, f.InlineLimits)
	setIf(&c.LogLevel, f.LogLevel)
	setIf(&c.MaxBatch, f.MaxBatch)
	setIf(&c.MaxRequestBytes, f.MaxRequestBytes)
	setIf(&c.PprofAddr, f.PprofAddr)
	setIf(&c.GRPCTransport, f.GRPCTransport)
	f.Cluster.apply(&c.Cluster)
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
	}
	if f.DeniedCache != nil {
		setIf(&c.DeniedCache.MaxEntries, f.DeniedCache.MaxEntries)
		setIf(&c.DeniedCache.MaxBytes, f.DeniedCache.MaxBytes)
	}
	f.applyTelemetry(c)
	if f.DefaultOnStoreError != nil {
		m, err := node.ParseFailureMode(*f.DefaultOnStoreError)
		if err != nil {
			return fmt.Errorf("default_on_store_error: %w", err)
		}
		c.DefaultOnStoreError = m
	}
	seen := map[string]int{}
	for _, fp := range f.Policies {
		p, err := fp.policy()
		if err != nil {
			return fmt.Errorf("line %d: policy %q: %w", fp.line, fp.Name, err)
		}
		if first, dup := seen[p.Name]; dup {
			return fmt.Errorf("line %d: policy %q: %w (first defined on line %d)", fp.line, p.Name, node.ErrDuplicatePolicy, first)
		}
		seen[p.Name] = fp.line
		c.Policies = append(c.Policies, p)
	}
	return nil
}

func (fp filePolicyAt) policy() (node.Policy, error) {
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
