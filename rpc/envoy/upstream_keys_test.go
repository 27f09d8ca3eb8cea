package envoy

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	rlstypev3 "github.com/quotad/quotad/proto/envoy/type/v3"
)

// share_threshold: every value its wildcard matches counts in one counter
// (files/a.pdf and files/b.csv share files/*'s 10); without it each value
// counts alone; on a value without a wildcard it is refused.
func TestShareThreshold(t *testing.T) {
	c, _ := fileService(t, Config{Domains: []Domain{fileDomain("s.yaml", "share",
		Descriptor{Key: "files", Value: "files/*", ShareThreshold: true, RateLimit: perUnit(3, "hour")},
		Descriptor{Key: "files_no_share", Value: "files_no_share/*", RateLimit: perUnit(3, "hour")},
	)}})
	want := func(what string, v string, key string, code any, remaining uint32) {
		t.Helper()
		st := shouldRateLimit(t, c, request("share", desc(key, v))).GetStatuses()[0]
		if st.GetCode() != code || st.GetLimitRemaining() != remaining {
			t.Errorf("%s %s: %s with %d remaining, want %s with %d", what, v, st.GetCode(), st.GetLimitRemaining(), code, remaining)
		}
	}
	for i, v := range []string{"files/a.pdf", "files/b.csv", "files/c"} {
		want("shared", v, "files", codeOK, uint32(2-i))
	}
	want("shared, a fourth file", "files/d", "files", codeOver, 0)
	for _, v := range []string{"files_no_share/a", "files_no_share/b"} {
		want("not shared", v, "files_no_share", codeOK, 2)
	}
	if _, err := Compile(Config{Domains: []Domain{fileDomain("s.yaml", "share", Descriptor{Key: "k", Value: "v", ShareThreshold: true, RateLimit: perUnit(1, "hour")})}}, nil); err == nil {
		t.Error("share_threshold on a value without a wildcard was taken")
	}
}

// quota_mode: a descriptor over a quota-mode rule is answered OVER_LIMIT
// but makes the request OVER_LIMIT only when every quota-mode descriptor
// of it is over, or another rule is; QuotaMode makes every rule one.
func TestQuotaMode(t *testing.T) {
	c, _ := fileService(t, Config{Domains: []Domain{fileDomain("q.yaml", "quota",
		Descriptor{Key: "soft", QuotaMode: true, RateLimit: perUnit(1, "hour")},
		Descriptor{Key: "soft2", QuotaMode: true, RateLimit: perUnit(5, "hour")},
		Descriptor{Key: "hard", RateLimit: perUnit(1, "hour")},
	)}})
	shouldRateLimit(t, c, request("quota", desc("soft", "a")))
	res := shouldRateLimit(t, c, request("quota", desc("soft", "a"), desc("soft2", "a")))
	if res.GetOverallCode() != codeOK || res.GetStatuses()[0].GetCode() != codeOver {
		t.Errorf("one of two quota descriptors over: overall %s, status %s; want OK overall, the status OVER_LIMIT", res.GetOverallCode(), res.GetStatuses()[0].GetCode())
	}
	if res := shouldRateLimit(t, c, request("quota", desc("soft", "a"))); res.GetOverallCode() != codeOver {
		t.Errorf("the only quota descriptor over: overall %s, want OVER_LIMIT", res.GetOverallCode())
	}
	shouldRateLimit(t, c, request("quota", desc("hard", "h")))
	if res := shouldRateLimit(t, c, request("quota", desc("hard", "h"), desc("soft2", "b"))); res.GetOverallCode() != codeOver {
		t.Errorf("a hard rule over beside a quota one within: overall %s, want OVER_LIMIT", res.GetOverallCode())
	}

	global, _ := fileService(t, Config{QuotaMode: true, Domains: []Domain{fileDomain("g.yaml", "quota",
		Descriptor{Key: "a", RateLimit: perUnit(1, "hour")}, Descriptor{Key: "b", RateLimit: perUnit(5, "hour")},
	)}})
	shouldRateLimit(t, global, request("quota", desc("a", "x")))
	if res := shouldRateLimit(t, global, request("quota", desc("a", "x"), desc("b", "x"))); res.GetOverallCode() != codeOK {
		t.Errorf("global quota mode, one of two over: overall %s, want OK", res.GetOverallCode())
	}
}

// An unlimited rule's descriptor is no quota, as envoyproxy/ratelimit
// leaves it out of the tally: its OK does not keep the request's only
// quota that is over, with or without the global quota mode, from making
// the request OVER_LIMIT.
func TestQuotaModeLeavesOutUnlimitedRules(t *testing.T) {
	for _, global := range []bool{false, true} {
		c, _ := fileService(t, Config{QuotaMode: global, Domains: []Domain{fileDomain("q.yaml", "quota",
			Descriptor{Key: "soft", QuotaMode: true, RateLimit: perUnit(1, "hour")},
			Descriptor{Key: "free", QuotaMode: true, RateLimit: &RateLimit{Unlimited: true}},
		)}})
		shouldRateLimit(t, c, request("quota", desc("soft", "a")))
		res := shouldRateLimit(t, c, request("quota", desc("free", "f"), desc("soft", "a")))
		if res.GetOverallCode() != codeOver {
			t.Errorf("global %t: an unlimited descriptor beside the only quota, over: overall %s, want OVER_LIMIT", global, res.GetOverallCode())
		}
	}
}

// With DynamicMetadata every answer carries the request's domain and
// descriptors and the metadata of the rules within their limits, merged.
func TestDynamicMetadata(t *testing.T) {
	md := func(m map[string]any) *structpb.Struct {
		s, err := structpb.NewStruct(m)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	c, _ := fileService(t, Config{DynamicMetadata: true, Domains: []Domain{fileDomain("m.yaml", "meta",
		Descriptor{Key: "model", Metadata: md(map[string]any{"tier": "gold", "labels": map[string]any{"team": "ml"}}), RateLimit: perUnit(1, "hour")},
		Descriptor{Key: "route", Metadata: md(map[string]any{"tier": "silver", "labels": map[string]any{"route": "chat"}}), RateLimit: perUnit(5, "hour")},
	)}})
	res := shouldRateLimit(t, c, request("meta", desc("model", "m1"), desc("route", "r1")))
	got := res.GetDynamicMetadata().AsMap()
	want := map[string]any{"tier": "gold", "labels": map[string]any{"team": "ml", "route": "chat"}}
	if got["domain"] != "meta" || len(got["descriptors"].([]any)) != 2 || !equalJSON(got["metadata"], want) {
		t.Errorf("dynamic metadata %v, want domain meta, two descriptors and metadata %v", got, want)
	}
	// model is over its limit now: only route's metadata.
	res = shouldRateLimit(t, c, request("meta", desc("model", "m1"), desc("route", "r1")))
	if m := res.GetDynamicMetadata().AsMap()["metadata"]; !equalJSON(m, map[string]any{"tier": "silver", "labels": map[string]any{"route": "chat"}}) {
		t.Errorf("with model over its limit, metadata %v, want route's alone", m)
	}
}

// As envoyproxy/ratelimit builds it, dynamic_metadata names a descriptor's
// own limit, and leaves out the metadata of an unlimited rule, whose
// descriptor is not among those that passed.
func TestDynamicMetadataLimitsAndUnlimited(t *testing.T) {
	c, _ := fileService(t, Config{DynamicMetadata: true, Domains: []Domain{fileDomain("m.yaml", "meta",
		Descriptor{Key: "free", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"free": structpb.NewBoolValue(true)}}, RateLimit: &RateLimit{Unlimited: true}},
		Descriptor{Key: "user", RateLimit: perUnit(5, "hour")},
	)}})
	own := desc("user", "u")
	own.Limit = &rlscommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: rlstypev3.RateLimitUnit_HOUR}
	got := shouldRateLimit(t, c, request("meta", desc("free", "f"), own)).GetDynamicMetadata().AsMap()
	if _, ok := got["metadata"]; ok {
		t.Errorf("dynamic metadata %v has metadata; want none, the unlimited rule's left out", got)
	}
	ds, _ := got["descriptors"].([]any)
	if len(ds) != 2 || !equalJSON(ds[1], map[string]any{"entries": []any{"user=u"}, "limit": "requests_per_unit:5 unit:HOUR"}) {
		t.Errorf("descriptors %v, want the second with its limit, requests_per_unit:5 unit:HOUR", ds)
	}
}

func equalJSON(a, b any) bool {
	x, err1 := structpb.NewValue(a)
	y, err2 := structpb.NewValue(b)
	return err1 == nil && err2 == nil && x.String() == y.String()
}

// value_to_metric names the statistics as envoyproxy/ratelimit's README
// and config tests say: each entry's key, with "_" and the runtime value
// only at the levels whose rule sets value_to_metric (a value the rule
// names, or a wildcard's pattern, otherwise); share_threshold keeps the
// pattern; detailed_metric takes precedence.
func TestValueToMetric(t *testing.T) {
	c, reader := fileService(t, Config{Domains: []Domain{
		fileDomain("v.yaml", "example10",
			Descriptor{Key: "route", ValueToMetric: true, Descriptors: []Descriptor{
				{Key: "http_method", ValueToMetric: true, Descriptors: []Descriptor{
					{Key: "subject_id", RateLimit: perUnit(60, "minute")}}}}},
			Descriptor{Key: "plain", RateLimit: perUnit(5, "hour")},
			Descriptor{Key: "mid", Descriptors: []Descriptor{
				{Key: "level", ValueToMetric: true, Descriptors: []Descriptor{{Key: "leaf", RateLimit: perUnit(5, "hour")}}}}},
			Descriptor{Key: "detailed", ValueToMetric: true, Descriptors: []Descriptor{
				{Key: "leaf", DetailedMetric: true, RateLimit: perUnit(5, "hour")}}},
		),
		fileDomain("w.yaml", "example10_wildcard",
			Descriptor{Key: "user", ValueToMetric: true, Descriptors: []Descriptor{
				{Key: "action", Value: "read*", ValueToMetric: true, Descriptors: []Descriptor{{Key: "resource", RateLimit: perUnit(100, "minute")}}},
				{Key: "action", Value: "write*", Descriptors: []Descriptor{{Key: "resource", RateLimit: perUnit(100, "minute")}}},
				{Key: "action", Value: "list*", ShareThreshold: true, ValueToMetric: true, Descriptors: []Descriptor{{Key: "resource", RateLimit: perUnit(100, "minute")}}},
			}},
		),
	}})
	shouldRateLimit(t, c, request("example10", desc("route", "api", "http_method", "GET", "subject_id", "123")))
	shouldRateLimit(t, c, request("example10", desc("route", "web", "http_method", "POST", "subject_id", "456")))
	shouldRateLimit(t, c, request("example10", desc("plain", "p1")))
	shouldRateLimit(t, c, request("example10", desc("mid", "m", "level", "l1", "leaf", "x")))
	shouldRateLimit(t, c, request("example10", desc("detailed", "d", "leaf", "x")))
	shouldRateLimit(t, c, request("example10_wildcard", desc("user", "alice", "action", "readfile", "resource", "documents")))
	shouldRateLimit(t, c, request("example10_wildcard", desc("user", "bob", "action", "writefile", "resource", "documents")))
	shouldRateLimit(t, c, request("example10_wildcard", desc("user", "carol", "action", "listdir", "resource", "documents")))
	got := envoyCounts(t, reader)["hits"]
	for _, want := range []string{
		"example10/route.http_method.subject_id/route_api.http_method_GET.subject_id",
		"example10/route.http_method.subject_id/route_web.http_method_POST.subject_id",
		"example10/plain",
		"example10/mid.level.leaf/mid.level_l1.leaf",
		"example10/detailed.leaf/detailed_d.leaf_x",
		"example10_wildcard/user.action_read*.resource/user_alice.action_readfile.resource",
		"example10_wildcard/user.action_write*.resource/user_bob.action_write*.resource",
		"example10_wildcard/user.action_list*.resource/user_carol.action_list*.resource",
	} {
		if got[want] != 1 {
			t.Errorf("no hit counted as %s; the hits are %v", want, got)
		}
	}
}

// A limit the request brings (the descriptor's limit field) replaces the
// rules' within a configured domain, whatever matched, counted in fixed
// windows of its unit; outside one, nothing is limited.
func TestLimitOverride(t *testing.T) {
	c, reader := fileService(t, Config{DropIn: true, Domains: []Domain{fileDomain("o.yaml", "over",
		Descriptor{Key: "user", RateLimit: perUnit(100, "minute")},
	)}})
	override := func(key, value string) *rlscommonv3.RateLimitDescriptor {
		d := desc(key, value)
		d.Limit = &rlscommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: rlstypev3.RateLimitUnit_MINUTE}
		return d
	}
	for _, key := range []string{"user", "unmatched"} {
		for i, want := range []rlsv3.RateLimitResponse_Code{codeOK, codeOK, codeOver} {
			st := shouldRateLimit(t, c, request("over", override(key, "u1"))).GetStatuses()[0]
			if st.GetCode() != want || st.GetCurrentLimit().GetRequestsPerUnit() != 2 {
				t.Errorf("%s, hit %d: %s with limit %v, want %s under 2 per minute", key, i+1, st.GetCode(), st.GetCurrentLimit(), want)
			}
		}
	}
	if st := shouldRateLimit(t, c, request("elsewhere", override("user", "u1"))).GetStatuses()[0]; st.GetCode() != codeOK || st.GetCurrentLimit() != nil {
		t.Errorf("an override in a domain that is not configured: %v, want a bare OK", st)
	}
	if got := envoyCounts(t, reader)["hits"]["over/(limit override)/user_u1"]; got != 3 {
		t.Errorf("the override's hits counted %d, want 3 under the domain's (limit override) rule", got)
	}
}

// A limit the request brings counts apart from the rule's and from another
// unit's on the same entries (the node keys an inline limit's state by the
// limit), as envoyproxy/ratelimit's counters are named by their window:
// their hits neither spend it nor restart its window. Unit 7 is WEEK, as
// there, though Envoy's RateLimitUnit has no name for it.
func TestLimitOverrideCountsPerUnit(t *testing.T) {
	c, _ := fileService(t, Config{Domains: []Domain{fileDomain("o.yaml", "over",
		Descriptor{Key: "user", RateLimit: perUnit(100, "minute")},
	)}})
	override := func(n uint32, unit rlstypev3.RateLimitUnit) *rlscommonv3.RateLimitDescriptor {
		d := desc("user", "u2")
		d.Limit = &rlscommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
		return d
	}
	call := func(d *rlscommonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		return shouldRateLimit(t, c, request("over", d)).GetStatuses()[0]
	}
	call(override(2, rlstypev3.RateLimitUnit_DAY))
	call(override(2, rlstypev3.RateLimitUnit_DAY))
	if st := call(desc("user", "u2")); st.GetCode() != codeOK || st.GetLimitRemaining() != 99 {
		t.Errorf("the rule after two overridden hits: %v, want OK with 99 of its 100 left", st)
	}
	if st := call(override(2, rlstypev3.RateLimitUnit_HOUR)); st.GetCode() != codeOK || st.GetLimitRemaining() != 1 {
		t.Errorf("2 an hour after 2 a day: %v, want OK with 1 left", st)
	}
	if st := call(override(2, rlstypev3.RateLimitUnit_DAY)); st.GetCode() != codeOver {
		t.Errorf("a third hit of 2 a day, after hits in minutes and hours: %v, want OVER_LIMIT", st)
	}
	if st := call(override(3, rlstypev3.RateLimitUnit(7))); st.GetCode() != codeOK || st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_WEEK {
		t.Errorf("unit 7: %v, want OK under a limit per WEEK", st)
	}
}

// MERGE_DOMAIN_CONFIG: two files of one domain merge their rules; a rule
// in both is refused, and so, without it, is the second file.
func TestMergeDomains(t *testing.T) {
	a := fileDomain("a.yaml", "m", Descriptor{Key: "user", RateLimit: perUnit(1, "hour")})
	b := fileDomain("b.yaml", "m", Descriptor{Key: "path", Value: "/x", RateLimit: perUnit(2, "hour")})
	c, _ := fileService(t, Config{MergeDomains: true, Domains: []Domain{a, b}})
	res := shouldRateLimit(t, c, request("m", desc("user", "u"), desc("path", "/x")))
	if res.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1 || res.GetStatuses()[1].GetCurrentLimit().GetRequestsPerUnit() != 2 {
		t.Errorf("merged domain answered %v, want both files' rules", res)
	}
	if _, err := Compile(Config{Domains: []Domain{a, b}}, nil); err == nil || !strings.Contains(err.Error(), "MERGE_DOMAIN_CONFIG") {
		t.Errorf("two files of one domain without merging: %v, want refused, naming MERGE_DOMAIN_CONFIG", err)
	}
	again := fileDomain("c.yaml", "m", Descriptor{Key: "user", RateLimit: perUnit(5, "hour")})
	if _, err := Compile(Config{MergeDomains: true, Domains: []Domain{a, again}}, nil); err == nil || !strings.Contains(err.Error(), `key "user" with no value is in both`) {
		t.Errorf("a rule in both merged files: %v, want refused", err)
	}
}
