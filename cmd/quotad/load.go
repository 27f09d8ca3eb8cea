package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// errHelp means --help was asked for and printed; main exits 0.
var errHelp = errors.New("help requested")

// textFlag and boolFlag hold a flag's raw text; settings parse it, so that
// flags, environment and file share one parser per knob.
type textFlag struct{ v string }

func (f *textFlag) String() string     { return f.v }
func (f *textFlag) Set(v string) error { f.v = v; return nil }

type boolFlag struct{ textFlag }

func (*boolFlag) IsBoolFlag() bool { return true }

// loadConfig builds the configuration: defaults, then the --config file,
// then QUOTAD_* environment variables, then flags.
func loadConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("quotad", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "YAML config `file` (policies and any setting below); flags and environment override it")
	all := settings()
	defaults := defaultConfig()
	for _, s := range all {
		if s.isBool {
			fs.Var(&boolFlag{}, s.name, s.usage+" (env "+s.env()+")")
		} else {
			fs.Var(&textFlag{}, s.name, s.usage+" (env "+s.env()+")")
		}
	}
	showVersion := fs.Bool("version", false, "print quotad's version, commit and Go version, and exit (also: quotad version)")
	fs.Usage = func() { usage(fs, defaults) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config{}, errHelp
		}
		return config{}, err
	}
	if *showVersion {
		return config{}, errVersion
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q (see quotad --help)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	c := defaults
	path := *configPath
	if path == "" {
		path = getenv("QUOTAD_CONFIG")
	}
	var doc *yamlDoc
	if path != "" {
		var err error
		if doc, err = loadFile(&c, path); err != nil {
			return config{}, err
		}
	}
	overrides := map[string]bool{}
	for _, s := range all {
		if v := getenv(s.env()); v != "" && !set[s.name] {
			if err := s.apply(&c, v); err != nil {
				return config{}, fmt.Errorf("environment %s: %w", s.env(), err)
			}
			overrides[s.name] = true
		}
	}
	for _, s := range all {
		if set[s.name] {
			if err := s.apply(&c, fs.Lookup(s.name).Value.String()); err != nil {
				return config{}, fmt.Errorf("flag --%s: %w", s.name, err)
			}
			overrides[s.name] = true
		}
	}
	if err := c.validate(); err != nil {
		return config{}, mergedError(err, doc, overrides)
	}
	return c, nil
}
