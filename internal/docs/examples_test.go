package docs

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/quotadtest"
)

// The examples of the README and docs/ that a reader runs against a quotad
// on localhost:8080 are run here, as written, against a built quotad on a
// free port, and their output is compared with what the page shows: the
// same answers, with only the times (which depend on the clock) left out.

// section returns the text of the page at path under the heading, up to
// the next heading of the same level.
func section(t *testing.T, path, heading string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("%s has no heading %q", path, heading)
	}
	s = s[i+len(heading)+2:]
	if j := strings.Index(s, "\n"+heading[:strings.Index(heading, " ")+1]); j >= 0 {
		s = s[:j]
	}
	return s
}

// blocks returns the bodies of the fenced blocks of text whose info
// string is lang ("" for blocks without one).
func blocks(text, lang string) []string {
	var out []string
	var body strings.Builder
	in, keep := false, false
	for _, l := range strings.Split(text, "\n") {
		switch {
		case !in && strings.HasPrefix(l, "```"):
			in, keep = true, strings.TrimPrefix(l, "```") == lang
			body.Reset()
		case in && l == "```":
			in = false
			if keep {
				out = append(out, body.String())
			}
		case in:
			body.WriteString(l + "\n")
		}
	}
	return out
}

// startQuotad runs the quotad binary with args on a free loopback port
// and returns its host:port; it is killed when the test ends.
func startQuotad(t *testing.T, args ...string) string {
	t.Helper()
	lines := startOutput(t, exec.Command(quotadtest.Binary(t), append([]string{"--listen", "127.0.0.1:0"}, args...)...))
	if !lines.Scan() {
		t.Fatal("quotad printed nothing")
	}
	first := lines.Text()
	go func() {
		for lines.Scan() {
		}
	}()
	const marker = "quotad listening on http://"
	if !strings.HasPrefix(first, marker) {
		t.Fatalf("first line %q does not say where quotad listens", first)
	}
	return strings.Fields(strings.TrimPrefix(first, marker))[0]
}

// startOutput starts cmd, killed when the test ends, and returns the
// lines of its standard output.
func startOutput(t *testing.T, cmd *exec.Cmd) *bufio.Scanner {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return bufio.NewScanner(out)
}

// runShell runs script with bash, with localhost:8080 pointing at addr,
// and returns its standard output.
func runShell(t *testing.T, script, addr string) string {
	t.Helper()
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (apt-get install %s): the docs' examples use it", tool, tool)
		}
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(script, "localhost:8080", addr))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the example failed: %v\n%s\noutput:\n%s", err, script, out)
	}
	return string(out)
}

// durations are the parts of an answer that depend on the clock.
var durations = regexp.MustCompile(`"(resetAfter|retryAfter|reset_after_ms|retry_after_ms|durationUntilReset)":\s*("[0-9.]+s"|[0-9]+)`)

// normalized is an answer without white space, with its clock-dependent
// waits marked as zero or not (a denial's wait is above zero, an allowed
// check's retry is zero).
func normalized(answer string) string {
	s := strings.Join(strings.Fields(answer), "")
	return durations.ReplaceAllStringFunc(s, func(m string) string {
		name, value, _ := strings.Cut(m, ":")
		if strings.Trim(value, `"0.s`) == "" {
			return name + ":0"
		}
		return name + ":>0"
	})
}

// The README's "Try it": five checks allowed with remaining counting
// down, then the denial the README shows.
func TestREADMETryItAnswersAsShown(t *testing.T) {
	text := section(t, "README.md", "## Try it")
	script, shown := blocks(text, "sh")[0], blocks(text, "json")[0]
	out := strings.Split(strings.TrimSpace(runShell(t, script, startQuotad(t))), "\n")
	if len(out) != 6 {
		t.Fatalf("%d answers, want 6:\n%s", len(out), strings.Join(out, "\n"))
	}
	for i, a := range out[:5] {
		if !strings.Contains(a, `"allowed":true`) || !strings.Contains(a, `"remaining":"`+string(rune('4'-i))+`"`) {
			t.Errorf("answer %d: %s; want allowed with remaining %d", i+1, a, 4-i)
		}
	}
	if got, want := normalized(out[5]), normalized(shown); got != want {
		t.Errorf("the sixth answer is\n%s\nthe README shows\n%s", out[5], shown)
	}
}

// docs/api.md's all-or-nothing example: two batches allowed, the third
// denied by the daily limit as the page shows, spending nothing.
func TestAllOrNothingExampleAnswersAsShown(t *testing.T) {
	text := section(t, "docs/api.md", "## All or nothing")
	script, shown := blocks(text, "sh")[0], blocks(text, "json")[0]
	out := strings.Split(strings.TrimSpace(runShell(t, script, startQuotad(t))), "\n")
	if len(out) != 3 {
		t.Fatalf("%d answers, want 3:\n%s", len(out), strings.Join(out, "\n"))
	}
	for i, remaining := range [][2]string{{"9", "1"}, {"8", "0"}} {
		a := normalized(out[i])
		if strings.Count(a, `"allowed":true`) != 2 || !strings.Contains(a, `"remaining":"`+remaining[0]+`"`) || !strings.Contains(a, `"remaining":"`+remaining[1]+`"`) {
			t.Errorf("batch %d: %s; want both allowed, remaining %s and %s", i+1, out[i], remaining[0], remaining[1])
		}
	}
	// The bucket refills between the second batch and the third: 8 or 9.
	got := strings.Replace(normalized(out[2]), `"remaining":"8"`, `"remaining":"9"`, 1)
	if want := normalized(shown); got != want {
		t.Errorf("the third batch answered\n%s\ndocs/api.md shows\n%s", out[2], shown)
	}
}

// docs/api.md's JSON spellings: the config file's spelling of an algorithm
// and Go's of a period are answered as the page shows (a token bucket of 5
// per minute, fresh, resets in exactly 12s), and the three mistakes with
// the messages it shows, byte for byte.
func TestJSONSpellingsExampleAnswersAsShown(t *testing.T) {
	text := section(t, "docs/api.md", "### JSON spellings")
	scripts, shown := blocks(text, "sh"), blocks(text, "json")
	if len(scripts) != 2 || len(shown) != 2 {
		t.Fatalf("the section has %d sh and %d json blocks, want 2 of each", len(scripts), len(shown))
	}
	addr := startQuotad(t)
	// protojson spaces its output at random; the errors are written by
	// encoding/json, the same every time.
	if got := runShell(t, scripts[0], addr); strings.Join(strings.Fields(got), "") != strings.Join(strings.Fields(shown[0]), "") {
		t.Errorf("the check answered\n%s\ndocs/api.md shows\n%s", got, shown[0])
	}
	if got := runShell(t, scripts[1], addr); got != shown[1] {
		t.Errorf("the mistakes were answered\n%s\ndocs/api.md shows\n%s", got, shown[1])
	}
}

// docs/client.md's `quotad check` examples print what the page shows.
func TestQuotadCheckExampleAnswersAsShown(t *testing.T) {
	text := section(t, "docs/client.md", "## `quotad check`")
	block := blocks(text, "sh")[0]
	cfg := filepath.Join(t.TempDir(), "quotad.yaml")
	policy := regexp.MustCompile(`policy api: (\{.*\})`).FindStringSubmatch(block)
	if policy == nil {
		t.Fatalf("the example does not say which policy api is:\n%s", block)
	}
	if err := os.WriteFile(cfg, []byte("policies:\n  - "+policy[1]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startQuotad(t, "--config", cfg)
	lines := strings.Split(strings.TrimSpace(block), "\n")
	ran := 0
	for i, l := range lines {
		if !strings.HasPrefix(l, "quotad check ") {
			continue
		}
		args := strings.Fields(strings.ReplaceAll(strings.TrimPrefix(l, "quotad "), "localhost:8080", addr))
		if !strings.Contains(l, "--addr") {
			args = append(args, "--addr", "http://"+addr)
		}
		out, _ := exec.Command(quotadtest.Binary(t), args...).Output() // exit 1 is a denial
		shown := lines[i+1]
		if got, want := normalized(strings.TrimSpace(string(out))), normalized(shown); got != want {
			t.Errorf("%s printed\n%s\ndocs/client.md shows\n%s", l, out, shown)
		}
		ran++
	}
	if ran != 2 {
		t.Fatalf("ran %d quotad check lines, want 2", ran)
	}
}

// docs/observability.md's "Try it": the metrics and the spans it prints,
// in the caller's trace, are the ones the page shows (span ids aside).
func TestObservabilityExamplePrintsTheSpansShown(t *testing.T) {
	if _, err := exec.LookPath("jq"); err != nil {
		t.Fatal("jq is not installed (apt-get install jq): docs/observability.md's example uses it")
	}
	text := section(t, "docs/observability.md", "## Try it")
	script := blocks(text, "sh")[0]
	shown := blocks(text, "")
	if len(shown) < 2 {
		t.Fatalf("docs/observability.md's Try it shows %d outputs, want the metrics and the spans", len(shown))
	}
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	const build = "go build -o quotad ./cmd/quotad\n"
	if !strings.HasPrefix(script, build) {
		t.Fatalf("the example no longer starts with %q:\n%s", build, script)
	}
	script = "cp " + quotadtest.Binary(t) + " quotad\n" + strings.Replace(strings.TrimPrefix(script, build), "./quotad ", "./quotad --listen "+addr+" ", 1)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(script, "localhost:8080", addr))
	cmd.Dir = dir
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("the example failed: %v\n%s", err, raw)
	}
	out := string(raw)
	for _, l := range strings.Split(strings.TrimSpace(shown[0]), "\n") {
		if !strings.Contains(out, l+"\n") {
			t.Errorf("the example did not print the metric %q:\n%s", l, out)
		}
	}
	ids := regexp.MustCompile(`"(parent|span)":"[0-9a-f]{16}"`)
	spans := func(s string) []string {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, `{"name":`) {
				lines = append(lines, ids.ReplaceAllStringFunc(l, func(m string) string {
					if strings.Contains(m, "00f067aa0ba902b7") {
						return m // the caller's span, from its traceparent
					}
					return m[:strings.Index(m, ":")] + `:"<id>"`
				}))
			}
		}
		return lines
	}
	got, want := spans(out), spans(shown[1])
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the example printed the spans\n%s\ndocs/observability.md shows\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
