package envoy

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// A file with every key of the format parses into its rules, lines and all.
func TestParseFile(t *testing.T) {
	const file = `# every key envoyproxy/ratelimit documents, and quotad_policy
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    detailed_metric: true
    rate_limit: {unit: DAY, requests_per_unit: 100, name: per-number}
  - key: id
    value: 500
    shadow_mode: true
    rate_limit:
      replaces:
        - name: per-number
      unit: second
      requests_per_unit: 0
  - key: ldap
    rate_limit:
      unlimited: true
  - key: bucket
    value: "v*"
    rate_limit:
      quotad_policy: per-ip
  - key: whitelisted
    rate_limit:
`
	got, _, err := ParseFile("messaging.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	want := Domain{Domain: "messaging", File: "messaging.yaml", Descriptors: []Descriptor{
		{Key: "message_type", Value: "marketing", Line: 4, Descriptors: []Descriptor{
			{Key: "to_number", Line: 7, RateLimit: &RateLimit{Unit: "day", RequestsPerUnit: rpu(5)}},
		}},
		{Key: "to_number", Line: 11, DetailedMetric: true, RateLimit: &RateLimit{Unit: "DAY", RequestsPerUnit: rpu(100), Name: "per-number"}},
		{Key: "id", Value: "500", Line: 14, ShadowMode: true, RateLimit: &RateLimit{Replaces: []string{"per-number"}, Unit: "second", RequestsPerUnit: rpu(0)}},
		{Key: "ldap", Line: 22, RateLimit: &RateLimit{Unlimited: true}},
		{Key: "bucket", Value: "v*", Line: 25, RateLimit: &RateLimit{Policy: "per-ip"}},
		{Key: "whitelisted", Line: 29},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parsed\n got %+v\nwant %+v", got, want)
	}
}

// ParseFile's errors name the file, the line and the descriptor path, and
// it counts the file's YAML nodes (aliases expanded) also when the walk
// fails, so that its caller can bound many files together; a text the
// YAML parser refuses counts none.
func TestParseFileErrorsAndNodes(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		nodes      int
		want       string
	}{
		{"fine", "domain: a\ndescriptors:\n  - &k {key: k}\n  - *k\n", 11, ""},
		{"empty", "", 0, "e.yaml: empty: a config file needs a domain"},
		{"not YAML", "domain: [x\n", 0, "e.yaml: line 1: YAML syntax: did not find expected ',' or ']'"},
		{"two documents", "domain: a\n---\ndomain: b\n", 0, "e.yaml: line 2: a second YAML document; one file holds one domain"},
		{"an alias inside what it names", "domain: a\ndescriptors: &d [{key: k, descriptors: *d}]\n", 0,
			"e.yaml: line 2: descriptors[0].descriptors: alias *d is inside the node it names (line 2), which would make it endless"},
		{"unknown key", "domain: a\ndescriptor: []\n", 5,
			`e.yaml: line 2: descriptor: unknown key "descriptor" (the keys here are domain, descriptors)`},
		{"deep path", "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        rate_limit: {replaces: [{name: [x]}]}\n", 21,
			"e.yaml: line 6: descriptors[0].descriptors[0].rate_limit.replaces[0].name: want a string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, nodes, err := ParseFile("e.yaml", []byte(tc.file))
			if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && got != tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
			if nodes != tc.nodes {
				t.Errorf("nodes %d, want %d", nodes, tc.nodes)
			}
			if d.File != "e.yaml" {
				t.Errorf("domain's file %q, want e.yaml", d.File)
			}
		})
	}
}

// envoyproxy/ratelimit's newer keys parse: metadata (any mapping),
// quota_mode, share_threshold and value_to_metric; metadata that is not a
// mapping is refused with its line.
func TestParseFileNewerKeys(t *testing.T) {
	d, _, err := ParseFile("n.yaml", []byte(`domain: n
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    value_to_metric: true
    quota_mode: true
    metadata:
      tier: gold
      limits: [1, 2]
      owner: {team: ml}
    rate_limit: {unit: hour, requests_per_unit: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := d.Descriptors[0]
	if !got.ShareThreshold || !got.ValueToMetric || !got.QuotaMode || got.Metadata.AsMap()["tier"] != "gold" {
		t.Errorf("parsed %+v, want every key set and the metadata's tier gold", got)
	}
	_, _, err = ParseFile("n.yaml", []byte("domain: n\ndescriptors:\n  - key: k\n    metadata: 5\n"))
	if err == nil || !strings.Contains(err.Error(), "n.yaml: line 4: descriptors[0].metadata: want a mapping") {
		t.Errorf("metadata 5: %v, want it refused with its line", err)
	}
}
