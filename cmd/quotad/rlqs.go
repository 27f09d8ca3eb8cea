package main

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/rpc/rlqs"
)

// The config file's rlqs section: Envoy's rate limit quota service, whose
// rules rlqs.Config documents. assignment_interval and abandon_after are
// settings (the table in settings.go); the domains are decoded into the
// structs below.
//
//	rlqs:
//	  assignment_interval: 2s
//	  abandon_after: 5m
//	  domains:
//	    - domain: edge
//	      buckets:
//	        - bucket: {tier: free, name: "*"}
//	          policy: free-per-client
//	        - bucket: {tier: internal}
//	          action: allow_all
//	      default: {action: deny_all}

// fileRLQSDomain is one domain of the rlqs section.
type fileRLQSDomain struct {
	Domain  string         `yaml:"domain"`
	Buckets []fileRLQSRule `yaml:"buckets"`
	Default fileRLQSTarget `yaml:"default"`
}

// fileRLQSRule is one rule of a domain.
type fileRLQSRule struct {
	Bucket bucketPattern `yaml:"bucket"`
	Policy string        `yaml:"policy"`
	Action string        `yaml:"action"`
}

// fileRLQSTarget is a domain's default.
type fileRLQSTarget struct {
	Policy string `yaml:"policy"`
	Action string `yaml:"action"`
}

// bucketPattern is a rule's bucket: a mapping of bucket id keys to
// values or patterns.
type bucketPattern map[string]string

func (p *bucketPattern) decodeNode(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("want a mapping of bucket_id keys to values, got %s", describeNode(n))
	}
	m := bucketPattern{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := valueNode(n.Content[i]), valueNode(n.Content[i+1])
		if k == nil || v == nil {
			return fmt.Errorf("a key or value is empty; write key: value, with \"*\" for any value")
		}
		key, err := yamlText(k)
		if err != nil {
			return fmt.Errorf("key: %w", err)
		}
		val, err := yamlText(v)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if _, dup := m[key]; dup {
			return fmt.Errorf("key %q given twice", key)
		}
		m[key] = val
	}
	*p = m
	return nil
}

// rlqsDomains converts the section's domains; rlqs.Config.Validate judges
// them.
func rlqsDomains(fs []fileRLQSDomain) []rlqs.Domain {
	ds := make([]rlqs.Domain, len(fs))
	for i, d := range fs {
		ds[i] = rlqs.Domain{Name: d.Domain, Default: rlqs.Target{Policy: d.Default.Policy, Action: d.Default.Action}}
		for _, r := range d.Buckets {
			ds[i].Buckets = append(ds[i].Buckets, rlqs.Rule{Bucket: r.Bucket, Target: rlqs.Target{Policy: r.Policy, Action: r.Action}})
		}
	}
	return ds
}
