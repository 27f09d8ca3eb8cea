package main

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The settings table is well formed: one entry per flag and per file key,
// every default parses and reads back the same, and a flag's text and the
// file's value of each setting set the same field.
func TestSettingsTable(t *testing.T) {
	all := settings()
	flags := map[string]bool{"config": true, "version": true, "print-settings": true, "help": true, "h": true}
	files := map[string]string{}
	for _, s := range all {
		if flags[s.flag] {
			t.Errorf("flag --%s declared twice", s.flag)
		}
		flags[s.flag] = true
		if !fieldPath.MatchString(s.file) {
			t.Errorf("--%s: file key %q is not a key path (a_b.c_d)", s.flag, s.file)
		}
		if other, dup := files[s.file]; dup {
			t.Errorf("--%s and --%s share the file key %s", s.flag, other, s.file)
		}
		files[s.file] = s.flag
		if s.help == "" || (s.arg == "") != s.v.isBool() {
			t.Errorf("--%s: help %q, arg %q: want a help text, and an arg unless the flag is boolean", s.flag, s.help, s.arg)
		}
		if n := countSet(s.def, s.zeroMeans, s.unset); n > 1 {
			t.Errorf("--%s: set at most one of def, zeroMeans and unset", s.flag)
		}
		var c config
		if s.def != "" {
			if err := s.v.parse(&c, s.def); err != nil || s.v.format(&c) != s.def {
				t.Errorf("--%s: default %q reads back as %q (%v)", s.flag, s.def, s.v.format(&c), err)
			}
		}
		if s.zeroMeans != "" && !slices.Contains([]string{"0", "0s"}, s.v.format(&config{})) {
			t.Errorf("--%s: zeroMeans on a setting whose zero value is %q, not a number", s.flag, s.v.format(&config{}))
		}
	}
	// No key is both a setting and a section (redis and redis.url).
	for key, flag := range files {
		for p := parentField(key); p != ""; p = parentField(p) {
			if other, ok := files[p]; ok {
				t.Errorf("--%s's key %s is under --%s's %s", flag, key, other, p)
			}
		}
	}
	for _, s := range all {
		text := sampleText(s)
		if text == "" {
			t.Errorf("--%s: no sample value parses", s.flag)
			continue
		}
		var byFlag config
		if err := s.v.parse(&byFlag, text); err != nil {
			t.Fatal(err)
		}
		byFile := config{}
		if err := parseFile(&byFile, "q.yaml", []byte(yamlAt(s.file, text))); err != nil {
			t.Errorf("--%s %s as %s in the file: %v", s.flag, text, s.file, err)
			continue
		}
		if got, want := s.v.format(&byFile), s.v.format(&byFlag); got != want || got == s.v.format(&config{}) {
			t.Errorf("--%s %s gives %q, the file's %s gives %q", s.flag, text, want, s.file, got)
		}
	}
}

func countSet(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}

// sampleText is a value other than the zero value that s's flag takes.
func sampleText(s setting) string {
	for _, text := range []string{"closed", "true", "0.5", "7", "3s", "a:1,b:2"} {
		var c config
		if s.v.parse(&c, text) == nil && s.v.format(&c) != s.v.format(&config{}) {
			return text
		}
	}
	return ""
}

// yamlAt is a config file that sets the dotted key to value.
func yamlAt(key, value string) string {
	var b strings.Builder
	parts := strings.Split(key, ".")
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i < len(parts)-1 {
			b.WriteString("\n")
		}
	}
	b.WriteString(" " + value + "\n")
	return b.String()
}

// readmeRow is one setting of a README configuration table.
type readmeRow struct {
	env, file, def string
}

// readmeSettings reads every configuration table of the README (a table
// whose header starts "| flag |"): by flag, its environment variable, file
// key ("" for "—") and default, backticks removed. A row may name several
// flags, with as many variables and keys, and one default.
func readmeSettings(t *testing.T, readme string) map[string]readmeRow {
	t.Helper()
	code := regexp.MustCompile("`([^`]*)`")
	rows := map[string]readmeRow{}
	var cols []string
	filePrefix := ""
	for _, line := range strings.Split(readme, "\n") {
		if !strings.HasPrefix(line, "|") {
			cols = nil
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case cols == nil && cells[0] == "flag":
			cols, filePrefix = cells, ""
			if m := regexp.MustCompile("^file \\(`([a-z_]+):`\\)$").FindStringSubmatch(cells[2]); m != nil {
				filePrefix = m[1] + "."
			}
			continue
		case cols == nil || strings.HasPrefix(cells[0], "---"):
			continue
		}
		if len(cells) != len(cols) {
			t.Errorf("table row %q has %d cells, its table %d", line, len(cells), len(cols))
			continue
		}
		get := func(col string) string {
			for i, c := range cols {
				if strings.HasPrefix(c, col) {
					return cells[i]
				}
			}
			t.Fatalf("README table %q has no column %q", cols, col)
			return ""
		}
		var flags, envs, keys []string
		for _, m := range code.FindAllStringSubmatch(get("flag"), -1) {
			flags = append(flags, strings.TrimPrefix(m[1], "--"))
		}
		for _, m := range code.FindAllStringSubmatch(get("env"), -1) {
			envs = append(envs, m[1])
		}
		for _, m := range code.FindAllStringSubmatch(get("file"), -1) {
			keys = append(keys, filePrefix+m[1])
		}
		def := strings.ReplaceAll(get("default"), "`", "")
		if len(envs) != len(flags) || (len(keys) != len(flags) && get("file") != "—") {
			t.Errorf("README row %q: %d flags, %d variables, %d file keys", line, len(flags), len(envs), len(keys))
			continue
		}
		for i, f := range flags {
			r := readmeRow{env: envs[i], def: def}
			if keys != nil {
				r.file = keys[i]
			}
			rows[f] = r
		}
	}
	return rows
}

// helpFacts matches the line of --help under a flag that has a default,
// an environment variable and maybe a config file key.
var helpFacts = regexp.MustCompile(`^      default (.*); env (\S+)(?:; file (\S+))?$`)

// helpSettings reads --help: by flag, its environment variable, file key
// and default, for every flag that has them.
func helpSettings(help string) map[string]readmeRow {
	out := map[string]readmeRow{}
	flag := ""
	for _, line := range strings.Split(help, "\n") {
		if name, ok := strings.CutPrefix(line, "  -"); ok {
			flag, _, _ = strings.Cut(name, " ")
		}
		if m := helpFacts.FindStringSubmatch(line); m != nil && flag != "" {
			out[flag] = readmeRow{def: m[1], env: m[2], file: m[3]}
		}
	}
	return out
}

// `quotad --help` and docs/configuration.md's tables name the same
// settings, with the same environment variables, file keys and defaults.
func TestConfigurationTablesMatchHelp(t *testing.T) {
	var help strings.Builder
	if _, err := loadConfig([]string{"--help"}, func(string) string { return "" }, &help); !errors.Is(err, errHelp) {
		t.Fatalf("--help returned %v", err)
	}
	raw, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	inHelp, inREADME := helpSettings(help.String()), readmeSettings(t, string(raw))
	if len(inHelp) != len(settings())+1 { // and --config
		t.Fatalf("read %d settings from --help, want %d:\n%s", len(inHelp), len(settings())+1, help.String())
	}
	for flag, h := range inHelp {
		r, ok := inREADME[flag]
		switch {
		case !ok:
			t.Errorf("--%s is in --help but in no table of docs/configuration.md", flag)
		case r != h:
			t.Errorf("--%s: docs/configuration.md says env %s, file %q, default %q; --help says env %s, file %q, default %q", flag, r.env, r.file, r.def, h.env, h.file, h.def)
		}
	}
	for flag := range inREADME {
		if _, ok := inHelp[flag]; !ok {
			t.Errorf("--%s is in docs/configuration.md's tables but not in --help", flag)
		}
	}
	t.Logf("%d settings compared", len(inHelp))
}

// --print-settings prints every setting's value and where it came from,
// and hides passwords.
func TestPrintSettings(t *testing.T) {
	path := writeFile(t, "q.yaml", "redis:\n  url: redis://app:s3cret@127.0.0.1:6399/0\nlease:\n  horizon: 50ms\n")
	env := map[string]string{"QUOTAD_REDIS_TIMEOUT": "80ms"}
	var out strings.Builder
	err := run(t.Context(), []string{"--config", path, "--print-settings", "--lease-hold", "2s"}, func(k string) string { return env[k] }, &out, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[0], "--") {
			lines[strings.TrimPrefix(f[0], "--")] = strings.Join(f[1:], " ")
		}
	}
	for flag, want := range map[string]string{
		"listen":           ":8080 default",
		"redis":            "redis://app:xxxxx@127.0.0.1:6399/0 file " + path + " line 2",
		"lease-horizon":    "50ms file " + path + " line 4",
		"redis-timeout":    "80ms env QUOTAD_REDIS_TIMEOUT",
		"lease-hold":       "2s flag",
		"breaker-failures": "0 (means 5) default",
		"redis-password":   "(none) default",
		"trace-exporter":   "(OTEL_TRACES_EXPORTER, else none) default",
	} {
		if lines[flag] != want {
			t.Errorf("--%s: %q, want %q", flag, lines[flag], want)
		}
	}
	if len(lines) != len(settings()) || strings.Contains(out.String(), "s3cret") {
		t.Errorf("%d settings printed, want %d, and no password:\n%s", len(lines), len(settings()), out.String())
	}
	env["QUOTAD_REDIS_PASSWORD"] = "hunter2"
	out.Reset()
	if err := run(t.Context(), []string{"--print-settings", "--redis-cluster", "a:1,b:2"}, func(k string) string { return env[k] }, &out, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "hunter2") || !strings.Contains(out.String(), "(hidden)") {
		t.Errorf("the password shows, or is not marked hidden:\n%s", out.String())
	}
}

// docs/errors.md quotes the "known:" lists of the config file's sections
// as quotad prints them; the lists follow the settings table.
func TestErrorsDocQuotesTheKnownFields(t *testing.T) {
	raw, err := os.ReadFile("../../docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"listen_addr: 1\n", "lease:\n  holds: 2s\n", "redis:\n  adress: b:1\n", "console:\n  show_key: false\n", "tls:\n  cert: x\n"} {
		c := defaultConfig()
		err := parseFile(&c, "q.yaml", []byte(file))
		var fe *fileError
		if !errors.As(err, &fe) {
			t.Fatalf("%q: %v, want a fileError", file, err)
		}
		_, msg, _ := strings.Cut(err.Error(), ": unknown field ")
		if msg == "" || !strings.Contains(string(raw), "unknown field "+msg) {
			t.Errorf("docs/errors.md does not quote %q", "unknown field "+msg)
		}
	}
}
