package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's grpcurl example: the same check through gRPC and server
// reflection, answered allowed with the inline limit's remaining count.
func TestREADMEGrpcurlExampleAnswers(t *testing.T) {
	script := blocks(section(t, "README.md", "## Try it"), "sh")[1]
	if !strings.HasPrefix(script, "grpcurl ") {
		t.Fatalf("the README's second Try it block is no longer the grpcurl example:\n%s", script)
	}
	addr := startQuotad(t)
	out := shell(t, shellEnv(t, freeAddr(t), true), t.TempDir(), script, addr)
	for _, want := range []string{`"allowed": true`, `"limit": "5"`, `"remaining": "4"`, `"source": "SOURCE_STORE"`} {
		if !strings.Contains(out, want) {
			t.Errorf("grpcurl printed\n%s\nwithout %s", out, want)
		}
	}
}

// docs/api.md's concurrency walk-through, a transcript of commands each
// followed by its answers (one per run: "# twice:" runs it twice), run
// against a quotad with the page's policy gpu: the same answers, the
// slots' ids and the clock's waits aside.
func TestConcurrencyWalkThroughAnswersAsShown(t *testing.T) {
	text := section(t, "docs/api.md", "## Concurrency limits")
	policy := regexp.MustCompile("policy `(\\w+)` of .*\\(`algorithm: (\\w+)`, `limit: (\\d+)`, `period: (\\w+)`\\)").FindStringSubmatch(strings.Join(strings.Fields(text), " "))
	if policy == nil {
		t.Fatal("docs/api.md no longer names the walk-through's policy in the words this test reads")
	}
	cfg := filepath.Join(t.TempDir(), "quotad.yaml")
	yaml := "policies:\n  - {name: " + policy[1] + ", algorithm: " + policy[2] + ", limit: " + policy[3] + ", period: " + policy[4] + "}\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startQuotad(t, "--config", cfg)

	lines := strings.Split(strings.TrimSpace(blocks(text, "sh")[0]), "\n")
	setup := lines[0]
	if !strings.HasPrefix(setup, "Q=") {
		t.Fatalf("the walk-through no longer starts by setting Q: %q", setup)
	}
	slotIDs := regexp.MustCompile(`"slotId":"([A-Z0-9]+)"`)
	docIDs, ranIDs := map[string]string{}, map[string]string{} // an id the page shows ↔ the one this run got
	commands := 0
	for i := 1; i < len(lines); {
		cmd := lines[i]
		if !strings.HasPrefix(cmd, "curl ") {
			t.Fatalf("line %q is neither a command nor an answer to one", cmd)
		}
		var shown []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "curl "); i++ {
			shown = append(shown, lines[i])
		}
		for id, ran := range docIDs {
			cmd = strings.ReplaceAll(cmd, id, ran)
		}
		for _, want := range shown {
			got := strings.TrimSpace(shell(t, nil, "", setup+"\n"+cmd, addr))
			if m, w := slotIDs.FindStringSubmatch(got), slotIDs.FindStringSubmatch(want); m != nil && w != nil {
				docIDs[w[1]], ranIDs[m[1]] = m[1], w[1]
			}
			for ran, id := range ranIDs {
				got = strings.ReplaceAll(got, ran, id)
			}
			if normalized(got) != normalized(want) {
				t.Errorf("%s answered\n%s\ndocs/api.md shows\n%s", cmd, got, want)
			}
			commands++
		}
	}
	if commands != 6 {
		t.Errorf("ran %d commands, want the page's 6", commands)
	}
}
