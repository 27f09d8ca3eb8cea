package docs

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/quotadtest"
)

// The examples that start quotad themselves (`quotad ... &`) run in a
// shell whose PATH has a `quotad` that listens on a free loopback port,
// with the page's localhost:8080 pointing at it; the shell and everything
// it started are killed when the test ends.

// grpcurlVersion is the grpcurl the Makefile installs (GRPCURL_VERSION).
const grpcurlVersion = "v1.9.4"

// grpcurlBinary finds grpcurl: $GRPCURL (make test sets it), the
// Makefile's .tools/grpcurl-<version>/grpcurl, or grpcurl on the PATH. Its
// absence fails the test with the way to install it.
func grpcurlBinary(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("GRPCURL"), filepath.Join(root, ".tools", "grpcurl-"+grpcurlVersion, "grpcurl")}
	if p, err := exec.LookPath("grpcurl"); err == nil {
		candidates = append(candidates, p)
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if abs, err := filepath.Abs(c); err == nil {
			if _, err := os.Stat(abs); err == nil {
				return abs
			}
		}
	}
	t.Fatalf("grpcurl not found: run `make grpcurl` (go install github.com/fullstorydev/grpcurl/cmd/grpcurl@%s into .tools/grpcurl-%s), or set GRPCURL", grpcurlVersion, grpcurlVersion)
	return ""
}

// freeAddr returns a loopback host:port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// shellEnv is a directory of commands for an example's shell: `quotad`,
// which serves on addr (the built binary with --listen addr, for a server,
// its output in a log the test prints if it fails; as it is for a
// subcommand such as `quotad check`), and `grpcurl`.
func shellEnv(t *testing.T, addr string, grpcurl bool) []string {
	t.Helper()
	bin := t.TempDir()
	log := filepath.Join(bin, "quotad.log")
	wrapper := "#!/bin/sh\ncase \"$1\" in -*|'') exec " + quotadtest.Binary(t) + " --listen " + addr + " \"$@\" >>" + log + " 2>&1;; esac\nexec " + quotadtest.Binary(t) + " \"$@\"\n"
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(log)
			t.Logf("quotad's output:\n%s", b)
		}
	})
	if err := os.WriteFile(filepath.Join(bin, "quotad"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if grpcurl {
		if err := os.Symlink(grpcurlBinary(t), filepath.Join(bin, "grpcurl")); err != nil {
			t.Fatal(err)
		}
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (apt-get install %s): the docs' examples use it", tool, tool)
		}
	}
	return append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// shell runs script with bash -euo pipefail in dir with env, localhost:8080
// replaced by host (host:port), and returns its standard output. What the
// script left running in the background (a quotad the next script asks)
// is killed when the test ends; the script itself after a minute.
func shell(t *testing.T, env []string, dir, script, host string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", strings.ReplaceAll(script, "localhost:8080", host))
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if cmd.Process != nil {
		pgid := cmd.Process.Pid
		t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	}
	if err != nil {
		t.Fatalf("the example failed: %v\n%s\nstdout:\n%s\nstderr:\n%s", err, script, out, stderr.String())
	}
	return string(out)
}

// serve starts script (a command that runs quotad in the foreground) in
// the background and returns once addr accepts connections; it is killed
// when the test ends.
func serve(t *testing.T, env []string, dir, script, addr string) {
	t.Helper()
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-exited })
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("%s exited: %v", script, err)
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("%s: nothing listens on %s after 30s", script, addr)
}
