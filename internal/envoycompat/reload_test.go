package envoycompat

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// eventually polls cond until it holds, failing the test after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The directory is hot reloaded: a changed limit, a new file and a removed
// one take effect while quotad serves; a broken file is logged, naming the
// file, line and path, and the rules in force stay.
func TestEnvoyDirHotReload(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		// Through a rename, as editors and Kubernetes do.
		tmp := filepath.Join(dir, ".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	azure := func(perMinute string) string {
		return "domain: internal\ndescriptors:\n  - key: azure\n    rate_limit:\n      unit: minute\n      requests_per_unit: " + perMinute + "\n"
	}
	write("internal.yaml", azure("100"))
	addr, stderr := runQuotad(t, "--envoy-config-dir", dir)
	c := dial(t, addr)
	azureLimit := func() uint32 {
		return c.call("internal", 1, desc("azure", "t")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := azureLimit(); got != 100 {
		t.Fatalf("azure: %d a minute, want 100", got)
	}

	write("internal.yaml", azure("50"))
	eventually(t, 20*time.Second, "the changed limit", func() bool { return azureLimit() == 50 })

	mongo := func() *rlsv3.RateLimitResponse_DescriptorStatus {
		return c.call("mongo_cps", 1, desc("database", "users")).GetStatuses()[0]
	}
	if st := mongo(); st.GetCurrentLimit() != nil {
		t.Fatalf("mongo_cps before its file: %v, want no limit", st)
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "readme", "example1.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	write("example1.yaml", string(raw))
	eventually(t, 20*time.Second, "the new file", func() bool { return mongo().GetCurrentLimit().GetRequestsPerUnit() == 500 })

	write("internal.yaml", strings.Replace(azure("50"), "minute", "fortnight", 1))
	eventually(t, 20*time.Second, "the broken file logged", func() bool {
		return strings.Contains(stderr.String(), "config reload failed")
	})
	for _, want := range []string{"internal.yaml: line 3: descriptors[0].rate_limit.unit", `\"fortnight\" is not a unit`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the log does not say %s:\n%s", want, stderr.String())
		}
	}
	if got := azureLimit(); got != 50 {
		t.Errorf("after the broken file: azure %d a minute, want the 50 in force", got)
	}
	if got := mongo().GetCurrentLimit().GetRequestsPerUnit(); got != 500 {
		t.Errorf("after the broken file: mongo_cps %d, want the 500 in force", got)
	}

	write("internal.yaml", azure("70"))
	if err := os.Remove(filepath.Join(dir, "example1.yaml")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the repair and the removal", func() bool {
		return azureLimit() == 70 && mongo().GetCurrentLimit() == nil
	})
}
