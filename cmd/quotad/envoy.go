package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/quotad/quotad/rpc/envoy"
)

// The config file's envoy section: Envoy's rate limit service, whose rules
// envoy.Config documents. Strict decoding applies here too (no custom
// unmarshalers), so an unknown field is an error naming its line. The
// section's domains are in quotad's schema, decoded into the structs
// below; config_dir, shadow_mode and near_limit_ratio are settings (the
// table in settings.go); config_dir names a directory of
// envoyproxy/ratelimit config files (read by envoy_dir.go, parsed by
// envoy.ParseFile).
//
//	envoy:
//	  domains:
//	    - domain: edge
//	      all_or_nothing: true            # spend on every descriptor or none
//	      descriptors:
//	        - key: remote_address
//	          policy: per-ip
//	          descriptors:
//	            - key: path
//	              value: /login
//	              policy: login-per-ip
//	  config_dir: /etc/ratelimit/config   # envoyproxy/ratelimit's files
//	  shadow_mode: false                  # its SHADOW_MODE
//	  near_limit_ratio: 0.8               # its NEAR_LIMIT_RATIO

// fileEnvoyDomain is one domain of the envoy section.
type fileEnvoyDomain struct {
	Domain       string                `yaml:"domain"`
	AllOrNothing bool                  `yaml:"all_or_nothing"`
	Descriptors  []fileEnvoyDescriptor `yaml:"descriptors"`
}

type fileEnvoyDescriptor struct {
	Key         string                `yaml:"key"`
	Value       string                `yaml:"value"`
	Policy      string                `yaml:"policy"`
	Unlimited   bool                  `yaml:"unlimited"`
	ShadowMode  bool                  `yaml:"shadow_mode"`
	Descriptors []fileEnvoyDescriptor `yaml:"descriptors"`
}

// envoyDomains converts the section's domains; envoy.Config.Validate
// judges them.
func envoyDomains(fs []fileEnvoyDomain) []envoy.Domain {
	if len(fs) == 0 {
		return nil
	}
	ds := make([]envoy.Domain, len(fs))
	for i, d := range fs {
		ds[i] = envoy.Domain{Domain: d.Domain, AllOrNothing: d.AllOrNothing, Descriptors: envoyDescriptors(d.Descriptors)}
	}
	return ds
}

func envoyDescriptors(fs []fileEnvoyDescriptor) []envoy.Descriptor {
	if len(fs) == 0 {
		return nil
	}
	ds := make([]envoy.Descriptor, len(fs))
	for i, f := range fs {
		ds[i] = envoy.Descriptor{
			Key: f.Key, Value: f.Value, Policy: f.Policy, Unlimited: f.Unlimited, ShadowMode: f.ShadowMode,
			Descriptors: envoyDescriptors(f.Descriptors),
		}
	}
	return ds
}

// envoyHeadersConfig is --envoy-response-headers and its names.
type envoyHeadersConfig struct {
	Enabled bool
	// Names are the limit, remaining and reset headers' names,
	// comma-separated; empty means envoy.DefaultResponseHeaders.
	Names string
}

func (h envoyHeadersConfig) validate() error {
	if h.Names == "" {
		return nil
	}
	if !h.Enabled {
		return errors.New("envoy: --envoy-response-header-names needs --envoy-response-headers")
	}
	if n := len(strings.Split(h.Names, ",")); n != 3 {
		return fmt.Errorf("envoy: --envoy-response-header-names %q: want three names, limit,remaining,reset (e.g. X-RateLimit-Limit,X-RateLimit-Remaining,X-RateLimit-Reset)", h.Names)
	}
	return nil
}

// envoyConfig is the configuration of Envoy's rate limit service: the
// config file's envoy section and the settings beside it.
func (c config) envoyConfig() envoy.Config {
	ec := c.Envoy
	if c.EnvoyHeaders.Enabled {
		h := envoy.DefaultResponseHeaders
		if names := strings.Split(c.EnvoyHeaders.Names, ","); len(names) == 3 { // validate checks
			h = envoy.ResponseHeaders{Limit: strings.TrimSpace(names[0]), Remaining: strings.TrimSpace(names[1]), Reset: strings.TrimSpace(names[2])}
		}
		ec.ResponseHeaders = &h
	}
	return ec
}
