package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/redis"
)

// This file holds the kinds of value a setting can have (text, a boolean,
// a whole number, a duration, a number, an address list, a failure mode):
// for each, where the value lives in config and how every source writes
// it. A flag and an environment variable give text; the config file gives
// a YAML node, read strictly (a fraction is never a whole number, "yes" is
// never true); --help and the effective settings print it back.

// value is a setting's value: where it lives in config and how each
// source sets it.
type value interface {
	// parse sets the value in c from text, a flag's or an environment
	// variable's; its error says what is wrong with the text.
	parse(c *config, text string) error
	// decode sets the value in c from n, the config file's node (never an
	// alias or null); its error says what is wrong with the value, in
	// words, and the caller adds the file, the line and the field.
	decode(c *config, n *yaml.Node) error
	// format is the value in c as a flag would take it; "" for none.
	format(c *config) string
	// isBool reports whether the flag takes no argument (--x means
	// --x=true).
	isBool() bool
}

// kind is a value of type T at the place in config that at returns.
type kind[T any] struct {
	at       func(*config) *T
	fromText func(string) (T, error)
	fromYAML func(*yaml.Node) (T, error)
	toText   func(T) string
	boolean  bool
}

func (k kind[T]) parse(c *config, text string) error {
	v, err := k.fromText(text)
	if err != nil {
		return err
	}
	*k.at(c) = v
	return nil
}

func (k kind[T]) decode(c *config, n *yaml.Node) error {
	v, err := k.fromYAML(n)
	if err != nil {
		return err
	}
	*k.at(c) = v
	return nil
}

func (k kind[T]) format(c *config) string { return k.toText(*k.at(c)) }
func (k kind[T]) isBool() bool            { return k.boolean }

// text is a string setting taken as written.
func text(at func(*config) *string) value {
	return kind[string]{at: at, fromText: func(s string) (string, error) { return s, nil }, fromYAML: yamlText, toText: func(s string) string { return s }}
}

// boolean is true or false: strconv.ParseBool's spellings on the command
// line, YAML's true and false in the file.
func boolean(at func(*config) *bool) value {
	return kind[bool]{at: at, fromText: parseBool, fromYAML: yamlBool, toText: strconv.FormatBool, boolean: true}
}

// whole is a whole number.
func whole(at func(*config) *int) value {
	return kind[int]{at: at, fromText: strconv.Atoi, fromYAML: func(n *yaml.Node) (int, error) {
		i, err := wholeNumber(n)
		if err == nil && int64(int(i)) != i {
			err = fmt.Errorf("%d is too large", i)
		}
		return int(i), err
	}, toText: strconv.Itoa}.wantWhole()
}

// whole64 is a whole number of 64 bits.
func whole64(at func(*config) *int64) value {
	return kind[int64]{at: at, fromText: func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }, fromYAML: wholeNumber,
		toText: func(i int64) string { return strconv.FormatInt(i, 10) }}.wantWhole()
}

// wantWhole makes k's text errors read "want a whole number, got ...".
func (k kind[T]) wantWhole() kind[T] {
	parse := k.fromText
	k.fromText = func(s string) (T, error) {
		v, err := parse(s)
		if err != nil {
			return v, fmt.Errorf("want a whole number, got %q", s)
		}
		return v, nil
	}
	return k
}

// duration is a Go duration: 50ms, 2s, 5m, 24h.
func duration(at func(*config) *time.Duration) value {
	return kind[time.Duration]{at: at, fromText: func(s string) (time.Duration, error) {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q (write e.g. 50ms, 2s)", s)
		}
		return d, nil
	}, fromYAML: yamlDurationValue, toText: formatDuration}
}

// number is a number with a fraction; example shows one in errors.
func number(at func(*config) *float64, example string) value {
	return kind[float64]{at: at, fromText: func(s string) (float64, error) { return parseNumber(s, example) }, fromYAML: yamlNumber, toText: formatNumber}
}

// optionalNumber is number where nil means unset.
func optionalNumber(at func(*config) **float64, example string) value {
	return kind[*float64]{at: at, fromText: func(s string) (*float64, error) {
		f, err := parseNumber(s, example)
		return &f, err
	}, fromYAML: func(n *yaml.Node) (*float64, error) {
		f, err := yamlNumber(n)
		return &f, err
	}, toText: func(f *float64) string {
		if f == nil {
			return ""
		}
		return formatNumber(*f)
	}}
}

// addresses is a list of host:port: comma-separated on the command line;
// in the file a YAML list or one comma-separated string.
func addresses(at func(*config) *[]string) value {
	return kind[[]string]{at: at, fromText: parseAddrs, fromYAML: yamlAddrs, toText: func(a []string) string { return strings.Join(a, ",") }}
}

// hostNames is a comma-separated list of host names, or in the file a
// list of them or one such string.
func hostNames(at func(*config) *[]string) value {
	return kind[[]string]{at: at, fromText: parseHostNames, fromYAML: yamlHostNames, toText: func(a []string) string { return strings.Join(a, ",") }}
}

func parseHostNames(v string) ([]string, error) {
	names := strings.Split(v, ",")
	for i, n := range names {
		names[i] = strings.TrimSpace(n)
		if names[i] == "" {
			return nil, fmt.Errorf("empty name in %q (want name,name, or * for every Host)", v)
		}
	}
	return names, nil
}

func yamlHostNames(n *yaml.Node) ([]string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return parseHostNames(n.Value)
	case yaml.SequenceNode:
		s := make([]string, len(n.Content))
		for i, item := range n.Content {
			if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
				return nil, fmt.Errorf("item %d: want a host name, got %s", i, describeNode(item))
			}
			s[i] = item.Value
		}
		return s, nil
	}
	return nil, fmt.Errorf("want a list of host names or one comma-separated string, got %s", describeNode(n))
}

// failureMode is open or closed.
func failureMode(at func(*config) *node.FailureMode) value {
	return kind[node.FailureMode]{at: at, fromText: node.ParseFailureMode, fromYAML: func(n *yaml.Node) (node.FailureMode, error) {
		s, err := yamlText(n)
		if err != nil {
			return 0, err
		}
		return node.ParseFailureMode(s)
	}, toText: node.FailureMode.String}
}

func parseBool(s string) (bool, error) {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("want true or false, got %q", s)
	}
	return b, nil
}

func parseNumber(s, example string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("want a number such as %s, got %q", example, s)
	}
	return f, nil
}

// parseAddrs splits a comma-separated list of addresses; empty items are
// an error rather than silently dropped.
func parseAddrs(v string) ([]string, error) {
	addrs := strings.Split(v, ",")
	for i, a := range addrs {
		addrs[i] = strings.TrimSpace(a)
		if addrs[i] == "" {
			return nil, fmt.Errorf("empty address in %q (want host:port,host:port)", redactList(v))
		}
	}
	return addrs, nil
}

// formatDuration writes d as a person would: 2m rather than 2m0s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func formatNumber(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// show writes a package's default as --help shows it.
func show[T int | int64 | float64 | time.Duration](v T) string {
	switch v := any(v).(type) {
	case time.Duration:
		return formatDuration(v)
	case float64:
		return formatNumber(v)
	}
	return fmt.Sprint(v)
}

// The YAML readers below take a node that is neither an alias nor null
// (the walker resolves those) and say what is wrong in words: never a Go
// type, never a YAML tag.

// yamlText reads a scalar as text.
func yamlText(n *yaml.Node) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("want text, got %s", describeNode(n))
	}
	return n.Value, nil
}

// yamlBool reads true or false, and nothing else YAML 1.1 allowed.
func yamlBool(n *yaml.Node) (bool, error) {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
		return false, fmt.Errorf("want true or false, got %s", describeNode(n))
	}
	return b, nil
}

// yamlNumber reads a finite number.
func yamlNumber(n *yaml.Node) (float64, error) {
	var f float64
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") || n.Decode(&f) != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("want a number such as 0.5, got %s", describeNode(n))
	}
	return f, nil
}

// yamlDurationValue reads a Go duration.
func yamlDurationValue(n *yaml.Node) (time.Duration, error) {
	v, err := time.ParseDuration(n.Value)
	if n.Kind != yaml.ScalarNode || err != nil {
		return 0, fmt.Errorf("invalid duration %s (write e.g. 500ms, 30s, 5m, 24h)", describeNode(n))
	}
	return v, nil
}

// yamlAddrs reads a list of host:port, or one comma-separated string as
// on the command line.
func yamlAddrs(n *yaml.Node) ([]string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		return parseAddrs(n.Value)
	case yaml.SequenceNode:
		s := make([]string, len(n.Content))
		for i, item := range n.Content {
			if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
				return nil, fmt.Errorf("item %d: want host:port, got %s", i, describeNode(item))
			}
			s[i] = item.Value
		}
		return s, nil
	}
	return nil, fmt.Errorf("want a list of host:port or one comma-separated string, got %s", describeNode(n))
}

// redactList is a comma-separated list of addresses or URLs with the
// password of each item redacted (redis.Redact), for errors and
// --print-settings.
func redactList(v string) string {
	items := strings.Split(v, ",")
	for i, it := range items {
		items[i] = redis.Redact(it)
	}
	return strings.Join(items, ",")
}
