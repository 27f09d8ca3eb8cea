package main

import (
	"errors"
	"strings"
	"testing"
)

// FuzzConfigFile parses arbitrary YAML as a config file. Neither parsing
// nor validating may panic, and every parse error is a fileError naming the
// file, with no Go type name (unless the file itself wrote it).
func FuzzConfigFile(f *testing.F) {
	for _, seed := range []string{
		"",
		"listen: \":8080\"\nredis: {url: \"redis://localhost:6379/0\", timeout: 50ms}\n",
		"redis:\n  sentinel: [a:1, b:2]\n  master: m\nbreaker: {failures: 3, probe_every: 1s}\n",
		"policies:\n  - name: api\n    algorithm: token_bucket\n    limit: 100\n    period: 1m\n    burst: 20\n    on_store_error: closed\n    lease: off\n",
		"policies:\n  - name: a\n    algorithm: gcra\n    limit: 5\n    period: 1s\n  - name: a\n    algorithm: gcra\n    limit: 1\n    period: 1s\n",
		"lease: {horizon: 1s, hold: 2s, max_fraction: 0.5}\ndenied_cache: {max_entries: 10}\n",
		"policies: [api]\n",
		"key_prefix: \"{x}\"\n",
		"&a [*a]\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		c := defaultConfig()
		err := parseFile(&c, "fuzz.yaml", []byte(text))
		if err != nil {
			var fe *fileError
			if !errors.As(err, &fe) || fe.Path != "fuzz.yaml" || !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			if m := goTypeName.FindString(err.Error()); m != "" && !strings.Contains(text, m) {
				t.Fatalf("error %q shows a Go type (%q)", err, m)
			}
			return
		}
		_ = c.validate() // what quotad does next; a panic fails the fuzz run
	})
}
