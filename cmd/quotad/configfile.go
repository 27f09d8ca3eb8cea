package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

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
