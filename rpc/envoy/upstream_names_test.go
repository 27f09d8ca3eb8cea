package envoy

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

// A statistic's statsd name is envoyproxy/ratelimit's: the rule's name,
// or a detailed rule's entries, with the dots of an IPv4 address and the
// characters statsd reserves written '_'; domain_not_found has none.
func TestUpstreamStatName(t *testing.T) {
	for _, c := range []struct {
		instrument string
		attrs      []attribute.KeyValue
		want       string
	}{
		{"quotad.envoy.hits", []attribute.KeyValue{attrDomain.String("messaging"), attrRule.String("message_type_marketing.to_number")},
			"ratelimit.service.rate_limit.messaging.message_type_marketing.to_number.total_hits"},
		{"quotad.envoy.over_limit", []attribute.KeyValue{attrDomain.String("edge"), attrRule.String("remote_address_50.0.0.5")},
			"ratelimit.service.rate_limit.edge.remote_address_50_0_0_5.over_limit"},
		{"quotad.envoy.near_limit", []attribute.KeyValue{attrDomain.String("d"), attrRule.String("key1"), attrDetail.String("key1_a:b|c")},
			"ratelimit.service.rate_limit.d.key1_a_b_c.near_limit"},
		{"quotad.envoy.within_limit", []attribute.KeyValue{attrDomain.String("d"), attrRule.String("k")}, "ratelimit.service.rate_limit.d.k.within_limit"},
		{"quotad.envoy.shadow_mode", []attribute.KeyValue{attrDomain.String("d"), attrRule.String("k")}, "ratelimit.service.rate_limit.d.k.shadow_mode"},
		{"quotad.envoy.global_shadow_mode", nil, "ratelimit.service.global_shadow_mode"},
		{"quotad.envoy.domain_not_found", nil, ""},
		{"quotad.decisions", nil, ""},
	} {
		got, ok := UpstreamStatName(c.instrument, attribute.NewSet(c.attrs...))
		if got != c.want || ok != (c.want != "") {
			t.Errorf("%s %v: %q %v, want %q", c.instrument, c.attrs, got, ok, c.want)
		}
	}
}
