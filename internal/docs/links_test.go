// Package docs holds the tests that keep the README and docs/ true to
// themselves: every link between them resolves.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const root = "../.."

// pages are the README and every page of docs/, by path from the root.
func pages(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range append(paths, filepath.Join(root, "README.md")) {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		out[rel] = string(raw)
	}
	return out
}

var (
	linkRe    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRe = regexp.MustCompile("(?m)^#{1,6} (.+)$")
	fenceRe   = regexp.MustCompile("(?ms)^```.*?^```")
)

// anchors are the ids GitHub gives a page's headings: lower case, spaces
// to hyphens, punctuation but hyphens and underscores dropped.
func anchors(page string) map[string]bool {
	out := map[string]bool{}
	for _, m := range headingRe.FindAllStringSubmatch(fenceRe.ReplaceAllString(page, ""), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(m[1])) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '—' && r != '–' && r != '×' && r != '≤' && r != '→':
				b.WriteRune(r)
			}
		}
		id := b.String()
		for n := 1; out[id]; n++ {
			id = b.String() + "-" + string(rune('0'+n))
		}
		out[id] = true
	}
	return out
}

// Every relative link of the README and docs/ names a file that exists,
// and every #fragment a heading of the page it points at.
func TestLinksResolve(t *testing.T) {
	all := pages(t)
	for path, page := range all {
		for _, m := range linkRe.FindAllStringSubmatch(fenceRe.ReplaceAllString(page, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Clean(filepath.Join(filepath.Dir(path), file))
				if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
					t.Errorf("%s links to %s, which does not exist", path, target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			page, ok := all[dest]
			if !ok {
				continue // a link into a source file's lines, say
			}
			if !anchors(page)[frag] {
				t.Errorf("%s links to %s, but %s has no heading #%s", path, target, dest, frag)
			}
		}
	}
}
