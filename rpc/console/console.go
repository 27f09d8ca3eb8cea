// Package console is quotad's web console: one page of hand-written HTML,
// CSS and JavaScript embedded in the binary, with no third-party code and
// nothing fetched from elsewhere, so it works with no network beyond the
// browser's connection to quotad.
//
// The page is a client of quotad's public API like any other: it checks,
// bursts and resets through quotad.v1.QuotaService over Connect's JSON
// protocol, and reads the node's live figures from GET /status (package
// rpc serves both). It has two views: the Playground, a card per
// algorithm driven with inline limits (or the configured policies when
// inline limits are off), and Live, the node's decisions, store calls,
// breaker, cluster and most denied keys, refreshed every second.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// Path is where the console's assets live; the page itself is at "/".
const Path = "/console/"

// contentSecurityPolicy lets the page load and call nothing but its own
// origin: a stray reference to a CDN would fail in the browser, visibly,
// rather than work only online.
const contentSecurityPolicy = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console: GET / is the page, GET /console/NAME its
// assets; any other path is 404. Mount it on "GET /{$}" and "GET
// /console/". It is safe for concurrent use.
func Handler() http.Handler {
	files, _ := fs.Sub(assets, "assets") // cannot fail: the directory is embedded
	static := http.StripPrefix(Path, http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		// The files change only with the binary; revalidating costs one
		// small request and never shows a page older than the server.
		h.Set("Cache-Control", "no-cache")
		switch {
		case r.URL.Path == "/":
			http.ServeFileFS(w, r, files, "index.html")
		case strings.HasPrefix(r.URL.Path, Path) && r.URL.Path != Path && !strings.HasSuffix(r.URL.Path, "/index.html"):
			static.ServeHTTP(w, r)
		default:
			http.NotFound(w, r)
		}
	})
}
