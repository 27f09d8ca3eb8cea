package envoycompat

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/quotad/quotad/internal/quotadtest"
)

// envoyproxy/ratelimit's config fixtures (its test/config, copied
// unchanged into testdata/upstream/config), each set of files served by
// the built binary from --envoy-config-dir: the sets upstream's
// config_test.go loads start, the sets it refuses stop quotad with an
// error naming the same problem.

// fixtureDir copies the fixtures files (as names, in order; a name twice
// is copied under a second name) into a directory.
func fixtureDir(t *testing.T, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	for i, f := range files {
		raw, err := os.ReadFile(filepath.Join("testdata", "upstream", "config", f))
		if err != nil {
			t.Fatal(err)
		}
		name := f
		if i > 0 && files[i-1] == f {
			name = "copy-of-" + f
		}
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startOrRefuse runs quotad on dir with args and returns "" once it serves
// (it is then stopped), or what it printed when it exits instead.
func startOrRefuse(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, quotadtest.Binary(t), append([]string{"--listen", "127.0.0.1:0", "--envoy-config-dir", dir}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	served := lines.Scan() && strings.HasPrefix(lines.Text(), "quotad listening on ")
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if served {
		return ""
	}
	return stderr.String()
}

func TestUpstreamConfigFixtures(t *testing.T) {
	for _, c := range []struct {
		name  string
		files []string
		args  []string
		// refused: what the error must say; "" when the files load.
		refused string
	}{
		{"basic_config", []string{"basic_config.yaml"}, nil, ""},
		{"shadowmode_config", []string{"shadowmode_config.yaml"}, nil, ""},
		{"wildcard", []string{"wildcard.yaml"}, nil, ""},
		{"share_threshold", []string{"share_threshold.yaml"}, nil, ""},
		{"metadata", []string{"metadata.yaml"}, nil, ""},
		{"merged domain", []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, []string{"--envoy-merge-domains"}, ""},
		{"a domain twice", []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, nil, "is configured twice"},
		{"duplicate domain", []string{"basic_config.yaml", "duplicate_domain.yaml"}, nil, "is configured twice"},
		{"duplicate key in merged files", []string{"merge_domain_key1.yaml", "merge_domain_key1.yaml"}, []string{"--envoy-merge-domains"}, "key1=value1 is in both"},
		{"bad limit unit", []string{"bad_limit_unit.yaml"}, nil, `"foo" is not a unit`},
		{"bad yaml", []string{"bad_yaml.yaml"}, nil, "bad_yaml.yaml"},
		{"duplicate key", []string{"duplicate_key.yaml"}, nil, "a rule for key1=value1 comes twice"},
		{"empty domain", []string{"empty_domain.yaml"}, nil, "empty_domain.yaml: domain: invalid envoy config: must not be empty"},
		{"empty key", []string{"empty_key.yaml"}, nil, "key: invalid envoy config: must not be empty"},
		{"misspelled key", []string{"misspelled_key.yaml"}, nil, `unknown key "ratelimit"`},
		{"misspelled key 2", []string{"misspelled_key2.yaml"}, nil, `unknown key "requestsperunit"`},
		{"non-map list", []string{"non_map_list.yaml"}, nil, "descriptors[0]: want a mapping"},
		{"non-string key", []string{"non_string_key.yaml"}, nil, `unknown key "0.25"`},
		{"replaces empty", []string{"replaces_empty.yaml"}, nil, "a replaced limit needs a name"},
		{"replaces self", []string{"replaces_self.yaml"}, nil, "cannot replace itself"},
		{"unlimited with unit", []string{"unlimited_with_unit.yaml"}, nil, "an unlimited rate limit takes no unit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := startOrRefuse(t, fixtureDir(t, c.files...), c.args...)
			switch {
			case c.refused == "" && out != "":
				t.Errorf("refused, want served:\n%s", out)
			case c.refused != "" && !strings.Contains(out, c.refused):
				t.Errorf("%s; want it refused saying %q", out, c.refused)
			}
		})
	}
}

// The limits upstream's config_test.go finds in its fixtures, asked over
// the wire: middle and multiple wildcards, a nested one, shared
// thresholds, and the metadata of the rules within their limits.
func TestUpstreamConfigFixturesDecide(t *testing.T) {
	dir := fixtureDir(t, "wildcard.yaml")
	addr, _ := runQuotad(t, "--envoy-config-dir", dir)
	c := dial(t, addr)
	for _, tc := range []struct {
		kv      []string
		perUnit uint32 // 0: no limit
	}{
		{[]string{"wild", "foo1"}, 20}, {[]string{"wild", "foo"}, 20}, {[]string{"wild", "bar"}, 0},
		{[]string{"noWild", "foo1"}, 0}, {[]string{"noVal", "anything"}, 20},
		{[]string{"midWild", "barab"}, 20}, {[]string{"midWild", "barb"}, 20}, {[]string{"midWild", "bara"}, 0}, {[]string{"midWild", "xbarb"}, 0},
		{[]string{"multiWild", "foo1bar2baz"}, 10}, {[]string{"multiWild", "foobaz"}, 0},
		{[]string{"nestedWild", "val1", "wild", "goo1"}, 20}, {[]string{"nestedWild", "val1", "wild", "foo1"}, 0},
	} {
		st := c.call("test-domain", 1, desc(tc.kv...)).GetStatuses()[0]
		if got := st.GetCurrentLimit().GetRequestsPerUnit(); got != tc.perUnit {
			t.Errorf("%v: limit %d, want %d", tc.kv, got, tc.perUnit)
		}
	}

	share := dial(t, func() string {
		a, _ := runQuotad(t, "--envoy-config-dir", fixtureDir(t, "share_threshold.yaml"))
		return a
	}())
	share.call("test-domain", 99, desc("files", "files/a.pdf"))
	if st := share.call("test-domain", 1, desc("files", "files/b.csv")).GetStatuses()[0]; st.GetCode() != ok || st.GetLimitRemaining() != 0 {
		t.Errorf("files/b.csv after 99 hits on files/a.pdf: %s, %d remaining; want OK with 0 (one shared threshold of 100)", st.GetCode(), st.GetLimitRemaining())
	}
	if st := share.call("test-domain", 1, desc("files", "files/c")).GetStatuses()[0]; st.GetCode() != over {
		t.Errorf("a third file over the shared 100: %s, want OVER_LIMIT", st.GetCode())
	}

	meta := dial(t, func() string {
		a, _ := runQuotad(t, "--envoy-config-dir", fixtureDir(t, "metadata.yaml"), "--envoy-dynamic-metadata")
		return a
	}())
	res := meta.call("test-domain", 1, desc("key1", "value1", "subkey1", "x"), desc("key2", "y"))
	got := res.GetDynamicMetadata().AsMap()["metadata"]
	want := map[string]any{"name": "service_1", "service_with_quota": map[string]any{"name": "service_2"}}
	if !sameJSON(got, want) {
		t.Errorf("dynamic metadata %v, want %v", got, want)
	}
}

// sameJSON reports whether a and b, JSON-like values, are equal.
func sameJSON(a, b any) bool {
	x, err1 := structpb.NewValue(a)
	y, err2 := structpb.NewValue(b)
	return err1 == nil && err2 == nil && proto.Equal(x, y)
}
