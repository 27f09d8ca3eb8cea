package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
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
	// RedisURL makes Redis the authoritative store; empty means the
	// embedded memory store.
	RedisURL string
	// RedisTimeout bounds each Redis call. Default 100ms.
	RedisTimeout time.Duration
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
	// Cluster makes the node a cluster member; the zero value runs
	// standalone.
	Cluster clusterConfig
}

func defaultConfig() config {
	return config{
		Listen:              ":8080",
		RedisTimeout:        100 * time.Millisecond,
		KeyPrefix:           "quotad",
		InlineLimits:        true,
		DefaultOnStoreError: node.FailOpen,
		ShutdownTimeout:     10 * time.Second,
		LogLevel:            "info",
	}
}

// nodeConfig, redisConfig and rpcConfig hand each package its part.
func (c config) nodeConfig() node.Config {
	return node.Config{
		KeyPrefix: c.KeyPrefix, Policies: c.Policies, DefaultFailureMode: c.DefaultOnStoreError,
		Lease: c.Lease, DeniedCache: c.DeniedCache,
	}
}

func (c config) redisConfig() node.RedisConfig {
	return node.RedisConfig{URL: c.RedisURL, Timeout: c.RedisTimeout}
}

func (c config) rpcConfig() rpc.Config {
	return rpc.Config{DisableInlineLimits: !c.InlineLimits}
}

// validate checks what no package checks for itself.
func (c config) validate() error {
	if c.Listen == "" {
		return errors.New("listen: must not be empty")
	}
	if c.RedisTimeout <= 0 {
		return fmt.Errorf("redis timeout: %s must be > 0", c.RedisTimeout)
	}
	if c.ShutdownTimeout <= 0 {
		return fmt.Errorf("shutdown timeout: %s must be > 0", c.ShutdownTimeout)
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		return err
	}
	if c.RedisURL != "" {
		if err := c.redisConfig().Validate(); err != nil {
			return err
		}
	}
	if err := c.Cluster.validate(c.RedisURL); err != nil {
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
	Policies            []filePolicyAt `yaml:"policies"`
	Cluster             *fileCluster   `yaml:"cluster"`
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
	URL     *string       `yaml:"url"`
	Timeout *yamlDuration `yaml:"timeout"`
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
	var f fileConfig
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	// An empty file decodes as io.EOF: no settings.
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %s", path, strings.ReplaceAll(err.Error(), "\n ", ""))
	}
	if err := f.apply(c); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

func (f fileConfig) apply(c *config) error {
	setIf(&c.Listen, f.Listen)
	setIf(&c.KeyPrefix, f.KeyPrefix)
	setIf(&c.InlineLimits, f.InlineLimits)
	setIf(&c.LogLevel, f.LogLevel)
	f.Cluster.apply(&c.Cluster)
	if f.ShutdownTimeout != nil {
		c.ShutdownTimeout = time.Duration(*f.ShutdownTimeout)
	}
	if f.Redis != nil {
		setIf(&c.RedisURL, f.Redis.URL)
		if f.Redis.Timeout != nil {
			c.RedisTimeout = time.Duration(*f.Redis.Timeout)
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
