package console

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func serve(t *testing.T, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Result()
}

func TestHandlerServesThePageAndItsAssets(t *testing.T) {
	for path, typ := range map[string]string{
		"/":                      "text/html; charset=utf-8",
		"/console/api.js":        "text/javascript; charset=utf-8",
		"/console/playground.js": "text/javascript; charset=utf-8",
		"/console/live.js":       "text/javascript; charset=utf-8",
		"/console/console.css":   "text/css; charset=utf-8",
		"/console/favicon.svg":   "image/svg+xml",
	} {
		resp := serve(t, path)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != typ || len(body) == 0 {
			t.Errorf("GET %s: %d %q, %d bytes; want 200 %q", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body), typ)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: CSP %q", path, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no nosniff", path)
		}
	}
	for _, path := range []string{"/console/", "/console/missing.js", "/console/index.html", "/elsewhere"} {
		if resp := serve(t, path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
		}
	}
}

// The page works offline: no file refers to another origin (a CDN, web
// fonts, analytics), and together they stay small.
func TestAssetsAreSelfContainedAndSmall(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|fonts\.googleapis`)
	total := 0
	err := fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(assets, path)
		if err != nil {
			return err
		}
		total += len(b)
		for _, m := range external.FindAllString(string(b), -1) {
			// The SVG namespace is a name, not a fetch.
			if m != "http://www.w3.org" {
				t.Errorf("%s refers to %q", path, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total > 96<<10 {
		t.Errorf("the console's assets are %d bytes; keep them under 96 KiB", total)
	}
	t.Logf("assets: %d bytes", total)
}
