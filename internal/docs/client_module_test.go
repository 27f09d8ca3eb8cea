package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// docs/client.md's whole program builds as a module of its own, which
// requires quotad's module (replaced by this checkout, built offline from
// the module cache), and prints what the page says against a quotad.
func TestClientFromAnotherModule(t *testing.T) {
	text := section(t, "docs/client.md", "### From your module")
	var program string
	for _, b := range blocks(text, "go") {
		if strings.HasPrefix(b, "package main") {
			program = b
		}
	}
	if program == "" {
		t.Fatal("docs/client.md's From your module has no whole program")
	}
	repo, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mod := "module example.com/quotadapp\n\ngo 1.26\n\nrequire github.com/quotad/quotad v0.0.0\n\nreplace github.com/quotad/quotad => " + repo + "\n"
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "quotad.yaml")
	for name, content := range map[string]string{"go.mod": mod, "go.sum": string(sum), "quotad.yaml": "policies:\n  - {name: api, algorithm: token_bucket, limit: 100, period: 1m}\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addr := startQuotad(t, "--config", cfg)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(strings.ReplaceAll(program, "localhost:8080", addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", "app", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the program does not build as a module of its own: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(dir, "app")).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "allowed: true remaining: 99" {
		t.Errorf("the program printed %q (%v), want what docs/client.md says", out, err)
	}
}
