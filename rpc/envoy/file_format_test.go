package envoy

import (
	"reflect"
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
