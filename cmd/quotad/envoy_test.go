package main

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/quotad/quotad/rpc/envoy"
)

const envoyPolicies = `
policies:
  - name: per-ip
    algorithm: fixed_window
    limit: 5
    period: 1m
  - name: login
    algorithm: gcra
    limit: 3
    period: 1m
`

// The envoy section becomes envoy.Config, nesting and all.
func TestEnvoyConfigFile(t *testing.T) {
	path := writeFile(t, "q.yaml", envoyPolicies+`
envoy:
  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          policy: per-ip
          descriptors:
            - key: path
              value: /login
              policy: login
              shadow_mode: true
        - key: remote_address
          value: 10.0.0.2
          unlimited: true
    - domain: internal
      all_or_nothing: true
      descriptors:
        - key: tenant
          policy: per-ip
`)
	c, err := loadConfig([]string{"--config", path}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := envoy.Config{Domains: []envoy.Domain{
		{Domain: "edge", Descriptors: []envoy.Descriptor{
			{Key: "remote_address", Policy: "per-ip", Descriptors: []envoy.Descriptor{
				{Key: "path", Value: "/login", Policy: "login", ShadowMode: true},
			}},
			{Key: "remote_address", Value: "10.0.0.2", Unlimited: true},
		}},
		{Domain: "internal", AllOrNothing: true, Descriptors: []envoy.Descriptor{{Key: "tenant", Policy: "per-ip"}}},
	}}
	if !reflect.DeepEqual(c.Envoy, want) {
		t.Fatalf("envoy config\n got %+v\nwant %+v", c.Envoy, want)
	}
	sw, _, err := loadEnvoy(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := sw.Rules().Domains(); !reflect.DeepEqual(got, []string{"edge", "internal"}) {
		t.Fatalf("the rules served have domains %v, want edge and internal", got)
	}
}

// Mistakes in the envoy section stop quotad with an error naming the file,
// the line or field path, and the culprit.
func TestEnvoyConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"unknown field", "envoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - key: a\n          polcy: per-ip\n",
			[]string{"q.yaml", "line 6", "polcy"}},
		{"unknown section field", "envoy:\n  domain: edge\n", []string{"q.yaml", "line 2", "domain"}},
		{"wrong type", "envoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - key: a\n          unlimited: sometimes\n",
			[]string{"q.yaml", "line 6", "sometimes"}},
		{"unknown policy", "envoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - key: a\n          descriptors:\n            - key: b\n              policy: per-ipp\n",
			[]string{"q.yaml", "envoy.domains[0].descriptors[0].descriptors[0].policy", `unknown policy "per-ipp"`}},
		{"rule without effect", "envoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - key: a\n          value: b\n",
			[]string{"envoy.domains[0].descriptors[0]", "applies to nothing"}},
		{"domain without rules", "envoy:\n  domains:\n    - domain: edge\n", []string{"envoy.domains[0].descriptors", `"edge"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "q.yaml", tc.file+envoyPolicies)
			_, err := loadConfig([]string{"--config", path}, func(string) string { return "" }, io.Discard)
			if err == nil {
				t.Fatal("loadConfig accepted a bad envoy section")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
