package docs

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/quotadtest"
)

// The lines the README says `go run ./cmd/quotad` prints are the lines a
// quotad started with no flags and no QUOTAD_* environment prints, but for
// its address (here a free port instead of :8080).
func TestREADMEStartupLinesAreWhatQuotadPrints(t *testing.T) {
	text := section(t, "README.md", "## The two commands")
	var want string
	for _, b := range blocks(text, "") {
		if strings.HasPrefix(b, "quotad listening on ") {
			want = b
		}
	}
	if want == "" {
		t.Fatal("the README's two commands section shows no startup lines")
	}
	cmd := exec.Command(quotadtest.Binary(t), "--listen", "127.0.0.1:0")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUOTAD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	sc := startOutput(t, cmd)
	lines := make(chan []string, 1)
	go func() {
		var got []string
		for len(got) < strings.Count(want, "\n") && sc.Scan() {
			got = append(got, sc.Text())
		}
		lines <- got
	}()
	var got []string
	select {
	case got = <-lines:
	case <-time.After(30 * time.Second):
		t.Fatal("quotad printed no startup lines within 30 s")
	}
	printed := regexp.MustCompile(`127\.0\.0\.1:\d+`).ReplaceAllString(strings.Join(got, "\n")+"\n", "localhost:8080")
	if printed != want {
		t.Fatalf("quotad printed:\n%s\nthe README shows:\n%s", printed, want)
	}
}
