package main

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/quotadtest"
)

func TestVersion(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"--version"}, func(string) string { return "" }, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "quotad ") || !strings.Contains(out.String(), " go1.") {
		t.Errorf("--version printed %q", out.String())
	}
	if _, err := loadConfig([]string{"--version"}, func(string) string { return "" }, io.Discard); !errors.Is(err, errVersion) {
		t.Errorf("loadConfig(--version) = %v", err)
	}
	// The subcommand, from a built binary.
	if out, err := exec.Command(quotadtest.Binary(t), "version").Output(); err != nil || !strings.HasPrefix(string(out), "quotad ") {
		t.Errorf("quotad version: %v %q", err, out)
	}

	stamped := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "GOOS", Value: "linux"}, {Key: "GOARCH", Value: "amd64"},
		{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "true"},
	}}
	if got, want := formatVersion(stamped), "quotad v1.2.3 commit 0123456789abcdef (modified) go1.26.8 linux/amd64"; got != want {
		t.Errorf("stamped build: %q, want %q", got, want)
	}
	if got, want := formatVersion(&debug.BuildInfo{GoVersion: "go1.26.8"}), "quotad (devel) commit unknown go1.26.8"; got != want {
		t.Errorf("unstamped build: %q, want %q", got, want)
	}
}
