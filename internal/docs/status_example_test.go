package docs

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/redistest"
)

// docs/console.md's `GET /status` example, as the page says it was taken
// (a node on Redis in a cluster of one, policies api and login, 200 checks
// on api and 45 on login, keys shown): the answer has every field the page
// shows and no other, and the counts the page's checks give.
func TestStatusExampleHasThePagesFields(t *testing.T) {
	text := section(t, "docs/console.md", "## GET /status")
	shown := blocks(text, "json")[0]
	var want map[string]any
	if err := json.Unmarshal([]byte(shown), &want); err != nil {
		t.Fatalf("docs/console.md's /status example is not JSON: %v", err)
	}

	dir := t.TempDir()
	cfg := filepath.Join(dir, "quotad.yaml")
	config := `policies:
  - {name: api, algorithm: token_bucket, limit: 2000, period: 1s, burst: 400}
  - {name: login, algorithm: fixed_window, limit: 3, period: 1m}
`
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	r := redistest.Start(t)
	addr := startQuotad(t, "--config", cfg, "--redis", r.URL(), "--console-show-keys",
		"--cluster-addr", freeAddr(t), "--cluster-insecure", "--node-name", "quotad-1")
	script := `for i in $(seq 200); do curl -s -o /dev/null -H 'Content-Type: application/json' localhost:8080/quotad.v1.QuotaService/Check -d '{"policy":"api","key":"k"}'; done
for i in $(seq 43); do curl -s -o /dev/null -H 'Content-Type: application/json' localhost:8080/quotad.v1.QuotaService/Check -d '{"policy":"login","key":"203.0.113.7"}'; done
for i in 1 2; do curl -s -o /dev/null -H 'Content-Type: application/json' localhost:8080/quotad.v1.QuotaService/Check -d '{"policy":"login","key":"198.51.100.23"}'; done
`
	shell(t, nil, "", script, addr)

	res, err := http.Get("http://" + addr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var got map[string]any
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("/status answered %s: %v", body, err)
	}
	if g, w := fieldPaths(got), fieldPaths(want); !slices.Equal(g, w) {
		t.Errorf("/status has the fields\n%s\ndocs/console.md shows\n%s", strings.Join(g, "\n"), strings.Join(w, "\n"))
	}
	policies, _ := got["policies"].([]any)
	counts := map[string]float64{}
	for _, p := range policies {
		p := p.(map[string]any)
		for _, outcome := range []string{"allowed", "denied"} {
			for _, n := range p[outcome].(map[string]any) {
				counts[p["name"].(string)] += n.(float64)
			}
		}
	}
	if counts["api"] != 200 || counts["login"] != 45 {
		t.Errorf("/status counted %v decisions, want api 200 and login 45", counts)
	}
}

// fieldPaths lists the paths of v's fields, sorted, an array's elements
// merged under "[]".
func fieldPaths(v any) []string {
	seen := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				seen[prefix+"."+k] = true
				walk(prefix+"."+k, c)
			}
		case []any:
			for _, c := range v {
				walk(prefix+"[]", c)
			}
		}
	}
	walk("", v)
	paths := make([]string, 0, len(seen))
	for p := range seen {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}
