package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// This file builds the configuration from its sources: defaults, then the
// --config file, then QUOTAD_* environment variables, then flags; all by
// the settings table.

// errHelp means --help was asked for and printed; main exits 0.
var errHelp = errors.New("help requested")

// textFlag and boolFlag hold a flag's raw text; the setting's kind parses
// it after the file, as it parses the environment's text.
type textFlag struct{ v string }

func (f *textFlag) String() string     { return f.v }
func (f *textFlag) Set(v string) error { f.v = v; return nil }

type boolFlag struct{ textFlag }

func (*boolFlag) IsBoolFlag() bool { return true }

// loaded is a configuration and where each of its settings came from.
type loaded struct {
	config
	// from says where each setting's value came from, by flag name:
	// "default", "file q.yaml line 3", "env QUOTAD_LISTEN" or "flag".
	from map[string]string
	// printSettings asks for the effective settings (--print-settings)
	// instead of serving.
	printSettings bool
}

// loadConfig builds the configuration: defaults, then the --config file,
// then QUOTAD_* environment variables, then flags.
func loadConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	l, err := load(args, getenv, stderr)
	return l.config, err
}

// load is loadConfig that also says where each setting came from.
func load(args []string, getenv func(string) string, stderr io.Writer) (loaded, error) {
	fs := flag.NewFlagSet("quotad", flag.ContinueOnError)
	// The flag package prints its error and the whole usage; quotad says
	// what went wrong in one line instead (unknownFlag), and prints the
	// usage only for --help.
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", configHelp)
	all := settings()
	for _, s := range all {
		if s.v.isBool() {
			fs.Var(&boolFlag{}, s.flag, s.help)
		} else {
			fs.Var(&textFlag{}, s.flag, s.help)
		}
	}
	showVersion := fs.Bool("version", false, versionHelp)
	printSettings := fs.Bool("print-settings", false, printSettingsHelp)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stderr, all)
			return loaded{}, errHelp
		}
		return loaded{}, flagError(err, fs, all)
	}
	if *showVersion {
		return loaded{}, errVersion
	}
	if fs.NArg() > 0 {
		return loaded{}, fmt.Errorf("unexpected argument %q (see quotad --help)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	l := loaded{config: defaultConfig(), from: map[string]string{}, printSettings: *printSettings}
	for _, s := range all {
		l.from[s.flag] = "default"
	}
	path := *configPath
	if path == "" {
		path = getenv("QUOTAD_CONFIG")
	}
	var doc *yamlDoc
	if path != "" {
		var err error
		if doc, err = loadFile(&l.config, path); err != nil {
			return loaded{}, err
		}
		for _, s := range all {
			if line, ok := doc.lines[s.file]; ok {
				l.from[s.flag] = fmt.Sprintf("file %s line %d", path, line)
			}
		}
	}
	// overrides holds the config file's sections that an environment
	// variable or a flag set part of (mergedError).
	overrides := map[string]bool{}
	for _, s := range all {
		if v := getenv(s.env()); v != "" && !set[s.flag] {
			if err := s.v.parse(&l.config, v); err != nil {
				return loaded{}, fmt.Errorf("environment %s: %w", s.env(), err)
			}
			overrides[s.section()] = true
			l.from[s.flag] = "env " + s.env()
		}
	}
	for _, s := range all {
		if set[s.flag] {
			if err := s.v.parse(&l.config, fs.Lookup(s.flag).Value.String()); err != nil {
				return loaded{}, fmt.Errorf("flag --%s: %w", s.flag, err)
			}
			overrides[s.section()] = true
			l.from[s.flag] = "flag"
		}
	}
	if err := l.validate(); err != nil {
		return loaded{}, mergedError(err, doc, overrides)
	}
	return l, nil
}

// defaultConfig is the configuration before any source: each setting's
// def (settings), the zero value elsewhere.
func defaultConfig() config {
	var c config
	for _, s := range settings() {
		if s.def == "" {
			continue
		}
		if err := s.v.parse(&c, s.def); err != nil {
			// TestSettingsTable parses every def: this is a typo in the table.
			panic(fmt.Sprintf("setting %s: default %q: %v", s.flag, s.def, err))
		}
	}
	return c
}
