package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// --pprof-addr serves Go's profiler on its own address, and only there.
func TestPprofAddr(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, []string{"--listen", "127.0.0.1:0", "--pprof-addr", "127.0.0.1:0"}, func(string) string { return "" }, pw, io.Discard)
		pw.CloseWithError(errors.New("quotad exited"))
		done <- err
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run returned %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("quotad did not stop within 15s")
		}
	}()
	var api, prof string
	lines := bufio.NewScanner(pr)
	for (api == "" || prof == "") && lines.Scan() {
		line := lines.Text()
		if rest, ok := strings.CutPrefix(line, "quotad listening on "); ok {
			api = strings.Fields(rest)[0]
		}
		if rest, ok := strings.CutPrefix(line, "pprof: "); ok {
			prof = strings.TrimSuffix(rest, "/debug/pprof/")
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if api == "" || prof == "" {
		t.Fatalf("startup lines lack the API (%q) or pprof (%q) address", api, prof)
	}
	get := func(url string) int {
		t.Helper()
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		_, _ = io.Copy(io.Discard, res.Body)
		return res.StatusCode
	}
	if code := get(prof + "/debug/pprof/goroutine?debug=1"); code != http.StatusOK {
		t.Errorf("GET %s/debug/pprof/goroutine: %d, want 200", prof, code)
	}
	if code := get(api + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("GET %s/debug/pprof/ on the API port: %d, want 404", api, code)
	}
}
