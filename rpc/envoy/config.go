package envoy

import (
	"google.golang.org/protobuf/types/known/structpb"
)

// This file is the rules' format: Config and the domains and rules it
// carries, in quotad's schema and in envoyproxy/ratelimit's.

// DefaultNearLimitRatio is Config.NearLimitRatio's default, as
// envoyproxy/ratelimit's NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// Namespace is the policy name under which rules with their own
// requests_per_unit (envoyproxy/ratelimit's files) count: their counters
// are the keys domain|key=value|... of the policy "envoy", so
// QuotaService.Reset can clear one.
const Namespace = "envoy"

// Config configures Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService). Its rules come in two
// schemas: quotad's (the config file's envoy section, whose rules name
// configured policies) and envoyproxy/ratelimit's (its config files,
// unchanged: rules carry rate_limit blocks). The zero value configures
// nothing: its rules serve nothing (Rules.Serves). It is a value: Validate
// and Compile only read it.
type Config struct {
	// Domains are the configured domains, of either schema; names are
	// unique across both.
	Domains []Domain
	// DropIn answers as envoyproxy/ratelimit does where quotad's own choices
	// differ: the rules serve even while no domain is configured (a rule
	// directory may start empty), and a request naming a domain that is not
	// configured gets OK for every descriptor (counted in
	// quotad.envoy.domain_not_found) instead of failing with
	// ErrUnknownDomain (NotFound on the wire).
	DropIn bool
	// ShadowMode is envoyproxy/ratelimit's SHADOW_MODE: decide and count as
	// usual, but answer overall_code OK where it would be OVER_LIMIT (the
	// descriptors' statuses are left as decided). Counted in
	// quotad.envoy.global_shadow_mode.
	ShadowMode bool
	// NearLimitRatio is the share of a limit above which hits count as
	// near_limit in the statistics, in (0, 1]. 0 means
	// DefaultNearLimitRatio (0.8).
	NearLimitRatio float64
	// ResponseHeaders, if not nil, adds envoyproxy/ratelimit's rate limit
	// headers to every answer with a limited descriptor
	// (LIMIT_RESPONSE_HEADERS_ENABLED): the limit, what is left and the
	// seconds until it resets, of the descriptor closest to its limit.
	ResponseHeaders *ResponseHeaders
	// StopIncrementWhenOverLimit is envoyproxy/ratelimit's
	// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: hits that do not fit are
	// not counted. By default every limited rule, of either schema and
	// whatever its policy's algorithm, counts every hit, as that project
	// does (a hits_addend of 27 under a limit of 10 is over the limit and
	// counted, so a 3 after it is over too: node.CheckOptions.Charge); an
	// AllOrNothing domain counts only what it admits, either way.
	StopIncrementWhenOverLimit bool
	// MergeDomains is envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: the
	// files of one domain merge into its rules, which must then not repeat
	// a rule (the same key and value, default or wildcard at the top);
	// without it a domain in two files is refused.
	MergeDomains bool
	// QuotaMode is envoyproxy/ratelimit's QUOTA_MODE: every rule is in
	// quota mode (Descriptor.QuotaMode).
	QuotaMode bool
	// DynamicMetadata is envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA:
	// every answer carries dynamic_metadata with the domain, the
	// descriptors, the request's hits_addend, and the merged metadata of
	// the rules of the descriptors within their limits.
	DynamicMetadata bool
}

// Domain is the rule tree of one domain, the namespace Envoy names in
// every request (the ratelimit filter's domain).
type Domain struct {
	// Domain is the name, non-empty.
	Domain string
	// File is the envoyproxy/ratelimit config file the domain comes from,
	// as errors should name it; empty for the rules of quotad's config file.
	// It selects the schema: with File, rules limit through RateLimit and
	// follow envoyproxy/ratelimit's rules (value wildcards, rules that limit
	// nothing); without, through Policy or Unlimited.
	File string
	// Descriptors are the rules for a descriptor's first entry. Among them,
	// (Key, Value) pairs are unique. quotad's schema requires at least one.
	Descriptors []Descriptor
	// AllOrNothing (quotad's schema only) decides the limited descriptors
	// of a request as one (node.CheckAll): either every one is within its
	// limit and spends its hits, or none spends. Off by default, as
	// envoyproxy/ratelimit, which spends on every descriptor that fits.
	// Descriptors of shadow_mode rules stay outside: they are decided on
	// their own and never deny the others.
	AllOrNothing bool
}

// Descriptor is one rule: it matches a descriptor entry, and says what
// limits a descriptor whose last entry it matches, and which rules match the
// entries after it.
//
// In quotad's schema, a rule with Policy, Unlimited or Descriptors set is
// valid; a rule with none of them would never apply to anything and is
// refused. In envoyproxy/ratelimit's, a rule with neither RateLimit nor
// Descriptors is valid and limits nothing (that project's "whitelisted").
type Descriptor struct {
	// Key must equal the entry's key; non-empty.
	Key string
	// Value must equal the entry's value. Empty means any value: the rule
	// is the key's default, used when no sibling rule matches the entry's
	// value, and every value is counted separately. In envoyproxy/ratelimit's
	// schema a value with '*' in it matches every value the pattern does,
	// each '*' standing for any run of characters ("foo*", "bar*b",
	// "foo*bar*baz"), after the exact values
	// and before the default; among such rules the first written wins.
	Value string
	// Policy (quotad's schema) is the name of the configured policy that
	// limits descriptors ending here. Empty means no limit here (nesting
	// only). Its limit and burst must fit Envoy's 32-bit counters (at most
	// 4294967295).
	Policy string
	// Unlimited (quotad's schema) means descriptors ending here are never
	// limited nor counted. It excludes Policy.
	Unlimited bool
	// RateLimit (envoyproxy/ratelimit's schema) is the rule's rate_limit
	// block; nil means descriptors ending here are not limited.
	RateLimit *RateLimit
	// ShadowMode means descriptors ending here are decided and counted, but
	// always answered OK: a way to try a limit before enforcing it. quotad's
	// schema requires a Policy with it; envoyproxy/ratelimit's takes it
	// anywhere (it does nothing without a rate limit).
	ShadowMode bool
	// DetailedMetric (envoyproxy/ratelimit's schema) labels the rule's
	// statistics with the descriptor's actual entries, not only the rule
	// (capped: see docs/envoy.md).
	DetailedMetric bool
	// ValueToMetric (envoyproxy/ratelimit's schema) labels the statistics
	// of the rules at and below this one with the descriptor's actual
	// values, as DetailedMetric does.
	ValueToMetric bool
	// ShareThreshold (envoyproxy/ratelimit's schema, a wildcard Value only)
	// counts every value the wildcard matches in one counter, named by the
	// pattern, for this rule and those below it: files/a.pdf and
	// files/b.csv share the limit of files/*.
	ShareThreshold bool
	// QuotaMode (envoyproxy/ratelimit's schema) makes the rule a soft
	// limit: a descriptor over it is answered OVER_LIMIT, but makes the
	// request OVER_LIMIT only when no other rule does and every quota-mode
	// descriptor of the request is over (Config.QuotaMode makes every rule
	// one).
	QuotaMode bool
	// Metadata (envoyproxy/ratelimit's schema) is added to the answer's
	// dynamic metadata when the descriptor is within its limit
	// (Config.DynamicMetadata).
	Metadata *structpb.Struct
	// Line is where the rule starts in File, for error messages; 0 when
	// unknown.
	Line int
	// Descriptors are the rules for the next entry.
	Descriptors []Descriptor
}

// RateLimit is envoyproxy/ratelimit's rate_limit block: requests per
// unit of time, counted in fixed windows aligned to the Unix epoch, or no
// limit at all, or (quotad's extension) a configured policy.
type RateLimit struct {
	// Unit is second, minute, hour, day, week (7 days), month (30 days) or
	// year (365 days), in any letter case. Required unless Unlimited or
	// Policy is set; refused with Unlimited.
	Unit string
	// RequestsPerUnit is the limit per unit. nil (not written) means 0, as
	// in envoyproxy/ratelimit: every hit is over the limit.
	RequestsPerUnit *uint32
	// Unlimited means descriptors ending here are never limited, and
	// answered with limit_remaining 4294967295.
	Unlimited bool
	// Name is the limit's name: answered in current_limit.name, and what
	// other rules' Replaces refer to. Optional.
	Name string
	// Replaces are names of limits this one replaces: when one request
	// carries descriptors matching both, the named limits are neither
	// decided nor counted. Each is non-empty and not this limit's own Name.
	Replaces []string
	// Policy (the file's quotad_policy) names a configured policy that
	// limits instead: any algorithm, burst and failure mode. It excludes
	// Unit, RequestsPerUnit and Unlimited; its limit and burst must fit
	// Envoy's 32-bit counters.
	Policy string
}

// ResponseHeaders names the three headers. The zero value is not valid;
// DefaultResponseHeaders are envoyproxy/ratelimit's names.
type ResponseHeaders struct {
	Limit, Remaining, Reset string
}

// DefaultResponseHeaders are envoyproxy/ratelimit's default header names
// (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER).
var DefaultResponseHeaders = ResponseHeaders{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
