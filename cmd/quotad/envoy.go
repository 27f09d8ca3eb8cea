package main

import "github.com/quotad/quotad/rpc"

// The config file's envoy section: Envoy's rate limit service, whose rules
// rpc.EnvoyConfig documents. Strict decoding applies here too (no custom
// unmarshalers), so an unknown field is an error naming its line.
//
//	envoy:
//	  domains:
//	    - domain: edge
//	      descriptors:
//	        - key: remote_address
//	          policy: per-ip
//	          descriptors:
//	            - key: path
//	              value: /login
//	              policy: login-per-ip

type fileEnvoy struct {
	Domains []fileEnvoyDomain `yaml:"domains"`
}

type fileEnvoyDomain struct {
	Domain      string                `yaml:"domain"`
	Descriptors []fileEnvoyDescriptor `yaml:"descriptors"`
}

type fileEnvoyDescriptor struct {
	Key         string                `yaml:"key"`
	Value       string                `yaml:"value"`
	Policy      string                `yaml:"policy"`
	Unlimited   bool                  `yaml:"unlimited"`
	ShadowMode  bool                  `yaml:"shadow_mode"`
	Descriptors []fileEnvoyDescriptor `yaml:"descriptors"`
}

// applyEnvoy sets c's envoy section from f, once apply has set the
// policies its rules name, and validates it: the section comes only from
// the file, so its errors can name the file.
func (f fileConfig) applyEnvoy(c *config) error {
	if f.Envoy == nil {
		return nil
	}
	c.Envoy = f.Envoy.config()
	return c.Envoy.Validate(c.Policies)
}

// config converts the section; rpc.EnvoyConfig.Validate judges it.
func (f fileEnvoy) config() rpc.EnvoyConfig {
	c := rpc.EnvoyConfig{Domains: make([]rpc.EnvoyDomain, len(f.Domains))}
	for i, d := range f.Domains {
		c.Domains[i] = rpc.EnvoyDomain{Domain: d.Domain, Descriptors: envoyDescriptors(d.Descriptors)}
	}
	return c
}

func envoyDescriptors(fs []fileEnvoyDescriptor) []rpc.EnvoyDescriptor {
	if len(fs) == 0 {
		return nil
	}
	ds := make([]rpc.EnvoyDescriptor, len(fs))
	for i, f := range fs {
		ds[i] = rpc.EnvoyDescriptor{
			Key: f.Key, Value: f.Value, Policy: f.Policy, Unlimited: f.Unlimited, ShadowMode: f.ShadowMode,
			Descriptors: envoyDescriptors(f.Descriptors),
		}
	}
	return ds
}
