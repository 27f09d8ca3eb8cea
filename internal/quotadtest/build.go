// Package quotadtest builds the quotad binary for tests that run it as a
// process (SIGTERM, multi-node clusters, stock clients). Test helper only.
package quotadtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

var (
	once sync.Once
	path string
	err  error
	out  []byte
)

// Race reports whether this test binary runs under the race detector, and
// so the quotad Binary builds: it runs several times slower, and its
// resident memory includes the detector's shadow memory.
func Race() bool { return raceEnabled }

// Binary builds cmd/quotad once per test binary and returns its path. It is
// built with -race when the calling test binary is, so the build reuses the
// packages `go test -race` has just compiled instead of compiling every
// dependency a second time. Every test in the binary shares the one build,
// under the OS temp directory.
func Binary(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		goBin, lookErr := exec.LookPath("go")
		if lookErr != nil {
			// go test puts its GOROOT/bin first on PATH; a test binary run
			// by hand on the machine that built it falls back to the
			// GOROOT it was built with, which is what runtime.GOROOT
			// (deprecated for binaries copied elsewhere) still reports.
			//lint:ignore SA1019 a test binary runs where it was built
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir, mkErr := os.MkdirTemp("", "quotad-bin-")
		if mkErr != nil {
			err = mkErr
			return
		}
		path = filepath.Join(dir, "quotad")
		args := []string{"build", "-o", path}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err = exec.Command(goBin, append(args, "github.com/quotad/quotad/cmd/quotad")...).CombinedOutput()
	})
	if err != nil {
		t.Fatalf("build quotad: %v\n%s", err, out)
	}
	return path
}
