package envoy

import (
	"regexp"
	"strings"

	"go.opentelemetry.io/otel/attribute"
)

// This file names the statistics of stats.go as envoyproxy/ratelimit
// sends them to statsd (its src/stats/manager_impl.go): per rule,
// ratelimit.service.rate_limit.DOMAIN.KEY_VALUE.total_hits and the like,
// and ratelimit.service.global_shadow_mode.

// upstreamRuleStats are envoyproxy/ratelimit's names of the per-rule
// counters, by the instrument's name.
var upstreamRuleStats = map[string]string{
	"quotad.envoy.hits":         "total_hits",
	"quotad.envoy.over_limit":   "over_limit",
	"quotad.envoy.near_limit":   "near_limit",
	"quotad.envoy.within_limit": "within_limit",
	"quotad.envoy.shadow_mode":  "shadow_mode",
}

// UpstreamStatName is envoyproxy/ratelimit's statsd name of a point of
// one of this package's counters: instrument is the counter's name
// (quotad.envoy.hits) and attrs the point's attributes. A rule's
// statistics are named by its domain and envoyproxy/ratelimit's name for
// it, or, for a detailed_metric rule and a request's own limit, by the
// descriptor's entries (past the first 100 distinct ones of a rule,
// "(other)"), with ':' and '|' and the dots of an IPv4 address written '_'
// as there. ok is false for a counter that has no such name:
// domain_not_found, which envoyproxy/ratelimit names by the domain a
// request asked for, and which quotad counts without it. Safe for
// concurrent use.
func UpstreamStatName(instrument string, attrs attribute.Set) (name string, ok bool) {
	if instrument == "quotad.envoy.global_shadow_mode" {
		return "ratelimit.service.global_shadow_mode", true
	}
	stat, ok := upstreamRuleStats[instrument]
	if !ok {
		return "", false
	}
	domain, _ := attrs.Value(attrDomain)
	key, _ := attrs.Value(attrRule)
	if detail, detailed := attrs.Value(attrDetail); detailed {
		key = detail
	}
	return "ratelimit.service.rate_limit." + sanitizeStatName(domain.AsString()+"."+key.AsString()) + "." + stat, true
}

// ipv4 finds the IPv4 addresses in a statistic's name.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// statNameChars are the characters statsd's line format reserves.
var statNameChars = strings.NewReplacer(":", "_", "|", "_")

// sanitizeStatName is envoyproxy/ratelimit's SanitizeStatName: ':' and
// '|' become '_', and so do the dots of an IPv4 address, which would
// otherwise split the name into levels.
func sanitizeStatName(s string) string {
	return ipv4.ReplaceAllStringFunc(statNameChars.Replace(s), func(ip string) string {
		return strings.ReplaceAll(ip, ".", "_")
	})
}
