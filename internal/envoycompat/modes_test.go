package envoycompat

import (
	"os"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// quota_mode on the built binary, as envoyproxy/ratelimit answers it: a
// quota-mode descriptor over its limit is OVER_LIMIT, but the request is
// OK while another quota-mode descriptor of it is within its limit, and
// OVER_LIMIT once every one is over; a rule not in quota mode that is
// over makes the request OVER_LIMIT whatever. --envoy-quota-mode makes
// every rule one.
func TestQuotaModeOnTheBinary(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: quota\ndescriptors:\n" +
		"  - key: small\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n" +
		"  - key: large\n    quota_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n" +
		"  - key: hard\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(dir, "quota.yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	perHour := func(n uint32) limit { return limit{n, rlsv3.RateLimitResponse_RateLimit_HOUR, ""} }
	addr, _ := runQuotad(t, "--envoy-config-dir", dir)
	c := dial(t, addr)

	c.call("quota", 1, desc("small", "s"), desc("large", "l"))
	res := c.call("quota", 1, desc("small", "s"), desc("large", "l"))
	c.want("small, over", res.GetStatuses()[0], over, perHour(1), 0)
	c.want("large, within", res.GetStatuses()[1], ok, perHour(2), 0)
	if res.GetOverallCode() != ok {
		t.Errorf("one quota-mode descriptor over, another within: overall %s, want OK", res.GetOverallCode())
	}
	res = c.call("quota", 1, desc("small", "s"), desc("large", "l"))
	if res.GetOverallCode() != over {
		t.Errorf("every quota-mode descriptor over: overall %s, want OVER_LIMIT", res.GetOverallCode())
	}
	c.call("quota", 1, desc("hard", "h"))
	res = c.call("quota", 1, desc("hard", "h"), desc("large", "fresh"))
	if res.GetOverallCode() != over {
		t.Errorf("a rule not in quota mode over, a quota-mode one within: overall %s, want OVER_LIMIT", res.GetOverallCode())
	}

	addr, _ = runQuotad(t, "--envoy-config-dir", dir, "--envoy-quota-mode")
	c = dial(t, addr)
	c.call("quota", 1, desc("hard", "h"))
	res = c.call("quota", 1, desc("hard", "h"), desc("large", "l"))
	c.want("hard, over, in quota mode", res.GetStatuses()[0], over, perHour(1), 0)
	if res.GetOverallCode() != ok {
		t.Errorf("--envoy-quota-mode, one rule over, another within: overall %s, want OK", res.GetOverallCode())
	}
}

// value_to_metric on the built binary: the statistics carry the runtime
// values at the levels that ask for them, named as envoyproxy/ratelimit's
// README example names them (example10.route_api.http_method_GET.subject_id).
func TestValueToMetricOnTheBinary(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: example10\ndescriptors:\n  - key: route\n    value_to_metric: true\n    descriptors:\n" +
		"      - key: http_method\n        value_to_metric: true\n        descriptors:\n" +
		"          - key: subject_id\n            rate_limit: {unit: minute, requests_per_unit: 60}\n"
	if err := os.WriteFile(filepath.Join(dir, "example10.yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := runQuotad(t, "--envoy-config-dir", dir)
	c := dial(t, addr)
	c.call("example10", 1, desc("route", "api", "http_method", "GET", "subject_id", "123"))
	c.call("example10", 2, desc("route", "web", "http_method", "POST", "subject_id", "456"))
	body := c.metrics()
	for detail, hits := range map[string]float64{
		"route_api.http_method_GET.subject_id":  1,
		"route_web.http_method_POST.subject_id": 2,
	} {
		if got := metric(body, "quotad_envoy_hits_total", "quotad_envoy_domain=example10", "quotad_envoy_detail="+detail); got != hits {
			t.Errorf("hits of %s: %v, want %v", detail, got, hits)
		}
	}
}
