package main

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// A config file's `algorithm: concurrency` policy takes slots: Check
// returns a slot id, a full limit denies, ReleaseSlot frees the slot and a
// second release is 404.
func TestRunServesConcurrencyPolicies(t *testing.T) {
	path := writeFile(t, "quotad.yaml", `
policies:
  - name: jobs
    algorithm: concurrency
    limit: 1
    period: 30s
`)
	base := startQuotad(t, "--config", path)
	post := func(method, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+"/quotad.v1.QuotaService/"+method, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	status, body := post("Check", `{"policy":"jobs","key":"k"}`)
	m := regexp.MustCompile(`"slotId":"([^"]+)"`).FindStringSubmatch(body)
	if status != 200 || m == nil || !strings.Contains(body, `"slotExpiresAfter":"30s"`) {
		t.Fatalf("check: %d %s", status, body)
	}
	if status, body := post("Check", `{"policy":"jobs","key":"k"}`); status != 200 || strings.Contains(body, `"allowed":true`) {
		t.Fatalf("check of a full limit: %d %s", status, body)
	}
	release := `{"policy":"jobs","key":"k","slotId":"` + m[1] + `"}`
	if status, body := post("ReleaseSlot", release); status != 200 {
		t.Fatalf("release: %d %s", status, body)
	}
	if status, body := post("ReleaseSlot", release); status != 404 || !strings.Contains(body, "slot not held") {
		t.Fatalf("second release: %d %s", status, body)
	}
	// quotad check prints the slot it took.
	code, out, errOut := runCheck(t, "--addr", base, "--policy", "jobs", "--key", "k")
	if code != 0 || !regexp.MustCompile(`^allowed  limit 1  remaining 0  reset in \S+  \(source store\)  slot \S+ \(expires in 30s\)\n$`).MatchString(out) {
		t.Fatalf("quotad check: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// Concurrency policies' own mistakes in the config file.
func TestConcurrencyConfigErrors(t *testing.T) {
	policy := "policies:\n  - name: jobs\n    algorithm: concurrency\n    limit: 5\n    period: 30s\n"
	for name, tc := range map[string]struct {
		file string
		want []string
	}{
		"burst":          {policy + "    burst: 2\n", []string{"line 6", "policies[0].burst: invalid burst: concurrency has no burst; leave it 0"}},
		"too many slots": {"policies:\n  - name: jobs\n    algorithm: concurrency\n    limit: 1000001\n    period: 30s\n", []string{"line 4", "policies[0].limit:", "allows at most 1000000"}},
		"an envoy rule": {policy + "envoy:\n  domains:\n    - domain: edge\n      descriptors:\n        - key: k\n          policy: jobs\n",
			[]string{`policy "jobs" is a concurrency limit`, "Envoy's rate limit protocol cannot"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := loadConfig([]string{"--config", writeFile(t, "q.yaml", tc.file)}, func(string) string { return "" }, io.Discard)
			if err == nil {
				t.Fatal("loadConfig accepted a bad configuration")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
