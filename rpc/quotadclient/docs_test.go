package quotadclient_test

import (
	"os"
	"strings"
	"testing"
)

// docs/client.md's middleware examples are ExampleMiddleware and
// ExampleTokenMiddleware, character for character, so that the docs show
// code go test compiles and runs.
func TestDocsShowTheMiddlewareExamples(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../docs/client.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ExampleMiddleware", "ExampleTokenMiddleware"} {
		start := strings.Index(string(src), "func "+name+"() {")
		if start < 0 {
			t.Fatalf("example_test.go has no %s", name)
		}
		end := strings.Index(string(src[start:]), "\n}\n")
		example := string(src[start : start+end+3])
		if !strings.Contains(string(readme), "```go\n"+example+"```\n") {
			t.Errorf("docs/client.md does not show %s as it is in example_test.go; copy it:\n%s", name, example)
		}
	}
}

// docs/client.md's concurrency snippet is a part of ExampleConcurrencyMiddleware,
// one tab less indented, so that go test compiles the call it shows.
func TestDocsShowExampleConcurrencyMiddleware(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../docs/client.md")
	if err != nil {
		t.Fatal(err)
	}
	const open = "```go\ninFlight, err := quotadclient.ConcurrencyMiddleware("
	start := strings.Index(string(readme), open)
	if start < 0 {
		t.Fatal("docs/client.md shows no ConcurrencyMiddleware snippet")
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
		t.Errorf("ExampleConcurrencyMiddleware does not contain docs/client.md's snippet, which is:\n%s", snippet)
	}
}
