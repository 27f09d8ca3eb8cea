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
