package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/redistest"
)

// runCheck runs `quotad check args...` with QUOTAD_ADDR unset and returns
// its exit code, stdout and stderr.
func runCheck(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr strings.Builder
	code := check(context.Background(), args, func(string) string { return "" }, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

var (
	allowedLine = regexp.MustCompile(`^allowed  limit (\d+)  remaining (\d+)  reset in \S+  \(source store\)\n$`)
	deniedLine  = regexp.MustCompile(`^denied  limit (\d+)  remaining 0  retry in (\S+)  reset in \S+  \(source store\)\n$`)
)

// Against a real quotad: exit 0 and a readable line while allowed, exit 1
// once denied, over each protocol.
func TestCheckPrintsDecisionsAndExitCodes(t *testing.T) {
	path := writeFile(t, "quotad.yaml", "policies:\n  - name: api\n    algorithm: fixed_window\n    limit: 2\n    period: 1m\n")
	base := startQuotad(t, "--config", path)
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		t.Run(protocol, func(t *testing.T) {
			args := []string{"--addr", base, "--protocol", protocol, "--policy", "api", "--key", "u-" + protocol}
			for i := range 2 {
				code, out, errOut := runCheck(t, args...)
				m := allowedLine.FindStringSubmatch(out)
				if code != 0 || m == nil || m[1] != "2" || m[2] != strconv.Itoa(1-i) || errOut != "" {
					t.Fatalf("check %d: exit %d, stdout %q, stderr %q; want exit 0 and \"allowed  limit 2  remaining %d ...\"", i+1, code, out, errOut, 1-i)
				}
			}
			code, out, _ := runCheck(t, args...)
			if code != 1 || !deniedLine.MatchString(out) {
				t.Fatalf("third check: exit %d, stdout %q; want exit 1 and a denied line with retry in", code, out)
			}
		})
	}
}

func TestCheckJSONAndInlineLimit(t *testing.T) {
	for name, args := range map[string][]string{"memory": nil, "redis": {"--redis", redistest.Start(t).URL()}} {
		t.Run(name, func(t *testing.T) {
			base := startQuotad(t, args...)
			inline := []string{"--addr", base, "--policy", "demo", "--key", "u1", "--algorithm", "token_bucket", "--limit", "1", "--period", "1m", "--burst", "3", "--json"}
			var d decisionJSON
			code, out, errOut := runCheck(t, append(inline, "--cost", "3")...)
			if err := json.Unmarshal([]byte(out), &d); err != nil || code != 0 {
				t.Fatalf("exit %d, stdout %q, stderr %q: %v", code, out, errOut, err)
			}
			if want := (decisionJSON{Allowed: true, Limit: 3, Remaining: 0, ResetAfterMS: d.ResetAfterMS, Source: "store"}); d != want || d.ResetAfterMS <= 0 {
				t.Fatalf("got %+v, want %+v with reset_after_ms > 0", d, want)
			}
			code, out, _ = runCheck(t, inline...)
			if err := json.Unmarshal([]byte(out), &d); err != nil || code != 1 || d.Allowed || d.RetryAfterMS <= 0 || d.RetryAfterMS > 60000 {
				t.Fatalf("after the burst: exit %d, %+v (%v); want exit 1, denied, retry_after_ms in (0, 60000]", code, d, err)
			}
			// Cost 0 reports without spending; still denied.
			if code, _, _ := runCheck(t, append(inline, "--cost", "0")...); code != 1 {
				t.Fatalf("cost 0: exit %d, want 1", code)
			}
		})
	}
}

// Everything that yields no decision exits 2 with a message on stderr and
// nothing on stdout.
func TestCheckFailuresExitTwo(t *testing.T) {
	base := startQuotad(t)
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://127.0.0.1:" + strconv.Itoa(port)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no key", []string{"--addr", base, "--policy", "api"}, "--key"},
		{"no policy", []string{"--addr", base, "--key", "k"}, "--policy"},
		{"unknown flag", []string{"--addr", base, "--policy", "api", "--key", "k", "--kye", "x"}, "kye"},
		{"stray argument", []string{"--addr", base, "--policy", "api", "--key", "k", "now"}, "now"},
		{"bad protocol", []string{"--addr", base, "--policy", "api", "--key", "k", "--protocol", "http3"}, "http3"},
		{"bad address", []string{"--addr", "localhost:8080", "--policy", "api", "--key", "k"}, "base URL"},
		{"partial inline limit", []string{"--addr", base, "--policy", "api", "--key", "k", "--limit", "5"}, "--algorithm, --limit and --period"},
		{"bad algorithm", []string{"--addr", base, "--policy", "api", "--key", "k", "--algorithm", "leaky", "--limit", "5", "--period", "1m"}, "leaky"},
		{"bad inline limit", []string{"--addr", base, "--policy", "api", "--key", "k", "--algorithm", "fixed_window", "--limit", "5", "--period", "1m", "--burst", "2"}, "burst"},
		{"unknown policy", []string{"--addr", base, "--policy", "api", "--key", "k"}, "not_found"},
		{"negative cost", []string{"--addr", base, "--policy", "d", "--key", "k", "--algorithm", "gcra", "--limit", "5", "--period", "1s", "--cost", "-1"}, "invalid_argument"},
		{"unreachable", []string{"--addr", closed, "--policy", "api", "--key", "k"}, "unavailable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCheck(t, tc.args...)
			if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2, no stdout, stderr mentioning %q", code, out, errOut, tc.want)
			}
		})
	}
}

func TestCheckHelpAndEnvironment(t *testing.T) {
	code, _, errOut := runCheck(t, "--help")
	if code != 0 || !strings.Contains(errOut, "Exit status: 0 allowed, 1 denied, 2") || !strings.Contains(errOut, "QUOTAD_ADDR") {
		t.Fatalf("--help: exit %d, %q", code, errOut)
	}
	base := startQuotad(t)
	var stdout, stderr strings.Builder
	env := func(k string) string {
		if k == "QUOTAD_ADDR" {
			return base
		}
		return ""
	}
	code = check(context.Background(), []string{"--policy", "p", "--key", "k", "--algorithm", "gcra", "--limit", "5", "--period", "1s"}, env, &stdout, &stderr)
	if code != 0 || !strings.HasPrefix(stdout.String(), "allowed") {
		t.Fatalf("with QUOTAD_ADDR: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}
