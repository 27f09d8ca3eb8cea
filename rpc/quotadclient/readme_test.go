package quotadclient_test

import (
	"os"
	"strings"
	"testing"
)

// The README's middleware example is ExampleMiddleware, character for
// character, so that the README shows code go test compiles and runs.
func TestREADMEShowsExampleMiddleware(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(src), "func ExampleMiddleware() {")
	end := strings.Index(string(src[start:]), "\n}\n")
	if start < 0 || end < 0 {
		t.Fatal("example_test.go has no ExampleMiddleware")
	}
	example := string(src[start : start+end+3])
	if !strings.Contains(string(readme), "```go\n"+example+"```\n") {
		t.Errorf("README.md does not show ExampleMiddleware as it is in example_test.go; copy it:\n%s", example)
	}
}

// The README's concurrency snippet is a part of ExampleConcurrencyMiddleware,
// one tab less indented, so that go test compiles the call it shows.
func TestREADMEShowsExampleConcurrencyMiddleware(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const open = "```go\ninFlight, err := quotadclient.ConcurrencyMiddleware("
	start := strings.Index(string(readme), open)
	if start < 0 {
		t.Fatal("README.md shows no ConcurrencyMiddleware snippet")
	}
	snippet := string(readme[start+len("```go\n"):])
	snippet = snippet[:strings.Index(snippet, "```\n")]
	indented := "\t" + strings.ReplaceAll(strings.TrimSuffix(snippet, "\n"), "\n", "\n\t") + "\n"
	example := string(src)
	if i := strings.Index(example, "func ExampleConcurrencyMiddleware() {"); i < 0 {
		t.Fatal("example_test.go has no ExampleConcurrencyMiddleware")
	} else {
		example = example[i:]
	}
	if !strings.Contains(example, indented) {
		t.Errorf("ExampleConcurrencyMiddleware does not contain the README's snippet; README shows:\n%s", snippet)
	}
}
