package envoycompat

import (
	"os"
	"path/filepath"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Through the wire, as envoyproxy/ratelimit answers: a value with a '*' in
// the middle limits the values it matches (it used to load and match
// nothing); a descriptor without entries, or with an empty key, is a bare
// OK beside the others instead of failing the request; an empty value is
// counted by the key's default rule.
func TestEdgeRequestsAndMiddleWildcards(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: edge\ndescriptors:\n  - key: midWild\n    value: bar*b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n" +
		"  - key: multiWild\n    value: foo*bar*baz\n    rate_limit: {unit: minute, requests_per_unit: 1}\n" +
		"  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := runQuotad(t, "--envoy-config-dir", dir)
	c := dial(t, addr)
	perMinute := func(n uint32) limit { return limit{n, rlsv3.RateLimitResponse_RateLimit_MINUTE, ""} }

	c.want("midWild=barab", c.call("edge", 1, desc("midWild", "barab")).GetStatuses()[0], ok, perMinute(1), 0)
	c.want("midWild=barab again", c.call("edge", 1, desc("midWild", "barab")).GetStatuses()[0], over, perMinute(1), 0)
	c.want("midWild=barX", c.call("edge", 1, desc("midWild", "barX")).GetStatuses()[0], ok, limit{}, 0)
	c.want("multiWild=foo-bar-baz", c.call("edge", 1, desc("multiWild", "foo-bar-baz")).GetStatuses()[0], ok, perMinute(1), 0)

	res := c.call("edge", 1, desc("user", "alice"), &commonv3.RateLimitDescriptor{}, desc("user", ""))
	if res.GetOverallCode() != ok {
		t.Errorf("a request with a descriptor without entries: overall %s, want OK", res.GetOverallCode())
	}
	c.want("user=alice", res.GetStatuses()[0], ok, perMinute(2), 1)
	c.want("no entries", res.GetStatuses()[1], ok, limit{}, 0)
	c.want("an empty value", res.GetStatuses()[2], ok, perMinute(2), 1)
	res = c.call("edge", 1, &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "", Value: "x"}}})
	c.want("an empty key", res.GetStatuses()[0], ok, limit{}, 0)
}
