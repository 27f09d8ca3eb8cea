package docs

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docs/envoy.md's "Try it": envoyproxy/ratelimit's example 2 from a
// directory, started and asked as the page says, answers as the page shows.
func TestEnvoyTryItAnswersAsShown(t *testing.T) {
	text := section(t, "docs/envoy.md", "### Try it")
	script, shown := blocks(text, "sh")[0], blocks(text, "json")[0]
	dir := t.TempDir()
	script = strings.ReplaceAll(script, "/tmp/rl", filepath.Join(dir, "rl"))
	addr := freeAddr(t)
	out := strings.TrimSpace(shell(t, shellEnv(t, addr, false), dir, script, addr))
	if got, want := normalized(out), normalized(shown); got != want {
		t.Errorf("the example answered\n%s\ndocs/envoy.md shows\n%s", out, shown)
	}
}

// docs/envoy.md's "Try it with grpcurl", run with the page's configuration:
// three OK answers counting down, then the OVER_LIMIT the page shows; the
// mixed request's three statuses as the page describes them; and the same
// through Connect's JSON.
func TestEnvoyGrpcurlExampleAnswersAsShown(t *testing.T) {
	config := blocks(section(t, "docs/envoy.md", "## Configuration"), "yaml")[0]
	text := section(t, "docs/envoy.md", "## Try it with grpcurl")
	sh, shown := blocks(text, "sh"), blocks(text, "json")
	if len(sh) != 3 || len(shown) != 1 {
		t.Fatalf("the section has %d shell blocks and %d answers, want 3 and 1", len(sh), len(shown))
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "quotad.yaml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	env := shellEnv(t, addr, true)
	out := shell(t, env, dir, sh[0], addr)

	answers := splitJSON(t, out)
	if len(answers) != 4 {
		t.Fatalf("%d answers, want 4:\n%s", len(answers), out)
	}
	for i, remaining := range []string{`"limitRemaining": 2`, `"limitRemaining": 1`, ""} {
		if !strings.Contains(answers[i], `"overallCode": "OK"`) || (remaining != "" && !strings.Contains(answers[i], remaining)) || (remaining == "" && strings.Contains(answers[i], "limitRemaining")) {
			t.Errorf("answer %d: %s; want OK with limitRemaining %q", i+1, answers[i], remaining)
		}
	}
	if got, want := normalized(answers[3]), normalized(shown[0]); got != want {
		t.Errorf("the fourth answer is\n%s\ndocs/envoy.md shows\n%s", answers[3], shown[0])
	}

	// The mixed request, against the same quotad (still running: the
	// first block left it in the background).
	mixed := shell(t, env, dir, sh[1], addr)
	var res struct {
		OverallCode string `json:"overallCode"`
		Statuses    []struct {
			Code         string `json:"code"`
			CurrentLimit *struct {
				RequestsPerUnit int    `json:"requestsPerUnit"`
				Unit            string `json:"unit"`
				Name            string `json:"name"`
			} `json:"currentLimit"`
			LimitRemaining     int64  `json:"limitRemaining"`
			DurationUntilReset string `json:"durationUntilReset"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal([]byte(mixed), &res); err != nil {
		t.Fatalf("%v:\n%s", err, mixed)
	}
	described := regexp.MustCompile("answers `OK` with `([^`]+)`, (\\d+) per (\\d+) `([A-Z]+)`, `limitRemaining` (\\d+) and\\s+`durationUntilReset` (\\w+) for the first; `limitRemaining` (\\d+) for the second").FindStringSubmatch(text)
	if described == nil {
		t.Fatal("docs/envoy.md no longer describes the mixed request's answer in the words this test reads")
	}
	if len(res.Statuses) != 3 || res.OverallCode != "OK" {
		t.Fatalf("the mixed request answered %s; want OK with 3 statuses", mixed)
	}
	first := res.Statuses[0]
	if first.Code != "OK" || first.CurrentLimit == nil || first.CurrentLimit.Name != described[1] || strconv.Itoa(first.CurrentLimit.RequestsPerUnit) != described[2] ||
		first.CurrentLimit.Unit != described[4] || first.DurationUntilReset != described[6] || strconv.FormatInt(first.LimitRemaining, 10) != described[5] {
		t.Errorf("the first status is %+v %+v; docs/envoy.md says %v", first, first.CurrentLimit, described[1:])
	}
	if s := res.Statuses[1]; s.Code != "OK" || strconv.FormatInt(s.LimitRemaining, 10) != described[7] {
		t.Errorf("the second status is %+v; docs/envoy.md says OK with limitRemaining %s", s, described[7])
	}
	if s := res.Statuses[2]; s.Code != "OK" || s.CurrentLimit != nil || s.LimitRemaining != 0 {
		t.Errorf("the third status is %+v; docs/envoy.md says a bare OK", s)
	}

	// Connect's JSON: the address is over its limit by now.
	if a := shell(t, env, dir, sh[2], addr); !strings.Contains(a, `"overallCode":"OVER_LIMIT"`) || !strings.Contains(a, `"name":"per-ip"`) {
		t.Errorf("Connect's JSON answered %s; want OVER_LIMIT by per-ip", a)
	}
}

// splitJSON splits grpcurl's output, one indented JSON object after
// another, into the objects.
func splitJSON(t *testing.T, out string) []string {
	t.Helper()
	var objs []string
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		var b bytes.Buffer
		if err := json.Indent(&b, raw, "", "  "); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, b.String())
	}
	return objs
}
