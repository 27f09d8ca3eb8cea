package envoycompat

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// With --envoy-response-headers, go-control-plane's client reads the rate
// limit headers in response_headers_to_add: the renamed limit, what is
// left and the seconds to reset of the descriptor closest to its limit,
// and none when no descriptor is limited.
func TestResponseHeaders(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: free\n    rate_limit: {unlimited: true}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := runQuotad(t, "--envoy-config-dir", dir, "--envoy-response-headers",
		"--envoy-response-header-names", "X-RateLimit-Limit,X-RateLimit-Remaining,X-RateLimit-Reset")
	c := dial(t, addr)

	res := c.call("edge", 1, desc("user", "alice"), desc("plan", "pro"))
	got := map[string]string{}
	for _, h := range res.GetResponseHeadersToAdd() {
		got[h.GetKey()] = h.GetValue()
	}
	reset, err := strconv.Atoi(got["X-RateLimit-Reset"])
	if got["X-RateLimit-Limit"] != "3" || got["X-RateLimit-Remaining"] != "2" || err != nil || reset < 1 || reset > 60 {
		t.Errorf("headers %v, want the per-user limit 3, 2 remaining and its reset within a minute", got)
	}
	res = c.call("edge", 1, desc("free", "x"))
	if hs := res.GetResponseHeadersToAdd(); len(hs) != 0 {
		t.Errorf("an unlimited descriptor's answer carries headers %v, want none", hs)
	}
}
