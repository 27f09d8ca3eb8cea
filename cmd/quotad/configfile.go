package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// This file reads the config file by the settings table: each setting's
// file key ("redis.timeout") is where the file sets it, so the file's
// schema (its sections and keys, and the "known:" lists of its errors) is
// the table's. What is not a setting, the policies and Envoy's rules, are
// lists the walker in yamlfile.go decodes into the structs below by their
// yaml tags.

// fileRules are the parts of the config file that are lists of rules
// rather than settings.
type fileRules struct {
	Policies     []filePolicy
	EnvoyDomains []fileEnvoyDomain
	RLQSDomains  []fileRLQSDomain
}

// fileLists are the file keys of fileRules' lists, in the order the file's
// errors list them after the settings of their section.
var fileLists = []struct {
	key string
	at  func(*fileRules) any
}{
	{"policies", func(r *fileRules) any { return &r.Policies }},
	{"envoy.domains", func(r *fileRules) any { return &r.EnvoyDomains }},
	{"rlqs.domains", func(r *fileRules) any { return &r.RLQSDomains }},
}

// fileSection is a mapping of the config file: the top level, or a
// section such as redis.
type fileSection struct {
	// names are the section's keys, in the order of the table.
	names []string
	keys  map[string]fileEntry
}

// fileEntry is what one key of a section holds: a setting, a section, or a
// list of fileRules (list points into them).
type fileEntry struct {
	setting *setting
	section *fileSection
	list    func(*fileRules) any
}

// fileSchema is the config file's top level, built from the settings'
// file keys and fileLists. Two settings with one key, or a key that is
// both a setting and a section, are mistakes in the table that
// TestSettingsTable catches; here the first one wins.
func fileSchema(all []setting) *fileSection {
	top := newFileSection()
	for i := range all {
		if all[i].file != "" {
			top.add(all[i].file, fileEntry{setting: &all[i]})
		}
	}
	for _, l := range fileLists {
		top.add(l.key, fileEntry{list: l.at})
	}
	return top
}

func newFileSection() *fileSection { return &fileSection{keys: map[string]fileEntry{}} }

// add puts k at the dotted key path under s, making the sections on the
// way.
func (s *fileSection) add(path string, k fileEntry) {
	name, rest, nested := strings.Cut(path, ".")
	have, ok := s.keys[name]
	if !ok {
		s.names = append(s.names, name)
		if !nested {
			s.keys[name] = k
			return
		}
		have = fileEntry{section: newFileSection()}
		s.keys[name] = have
	}
	if nested && have.section != nil {
		have.section.add(rest, k)
	}
}

// decodeSection applies n, the mapping at field (the top level for ""),
// to c by sec: each key must be one of sec's, once; a setting's value is
// read as its kind says, a list into rules.
func (d *yamlDoc) decodeSection(n *yaml.Node, field string, sec *fileSection, c *config, rules *fileRules) error {
	n = valueNode(n)
	if n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return d.errorAt(n.Line, field, fmt.Errorf("want a mapping of %s, got %s", strings.Join(sec.names, ", "), describeNode(n)))
	}
	pairs, err := d.mappingPairs(n, field)
	if err != nil {
		return err
	}
	seen := map[string]int{}
	for _, kv := range pairs {
		k, val := kv[0], kv[1]
		name := joinField(field, k.Value)
		key, ok := sec.keys[k.Value]
		if !ok {
			return d.unknownField(k, field, sec.names)
		}
		if first, dup := seen[k.Value]; dup {
			return d.errorAt(k.Line, name, fmt.Errorf("given twice (first on line %d)", first))
		}
		seen[k.Value] = k.Line
		d.lines[name] = k.Line
		switch {
		case key.section != nil:
			err = d.decodeSection(val, name, key.section, c, rules)
		case key.list != nil:
			err = d.decode(val, name, reflect.ValueOf(key.list(rules)).Elem())
		default:
			err = d.decodeSetting(val, name, key.setting, c)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decodeSetting applies n, the value of setting s at field, to c.
func (d *yamlDoc) decodeSetting(n *yaml.Node, field string, s *setting, c *config) error {
	n = valueNode(n)
	if n == nil {
		return nil
	}
	if err := s.v.decode(c, n); err != nil {
		return d.errorAt(n.Line, field, err)
	}
	return nil
}

// filePolicy is one policy of the config file.
type filePolicy struct {
	Name         string       `yaml:"name"`
	Algorithm    string       `yaml:"algorithm"`
	Limit        int64        `yaml:"limit"`
	Period       yamlDuration `yaml:"period"`
	Burst        int64        `yaml:"burst"`
	OnStoreError string       `yaml:"on_store_error"`
	Lease        string       `yaml:"lease"`
}

// yamlDuration is a duration written as Go does: "1s", "5m", "250ms".
type yamlDuration time.Duration

func (d *yamlDuration) decodeNode(n *yaml.Node) error {
	v, err := yamlDurationValue(n)
	*d = yamlDuration(v)
	return err
}

// loadFile applies the YAML file at path on top of c, records it in
// c.File, and returns where each of its fields stands.
func loadFile(c *config, path string) (*yamlDoc, error) {
	raw, err := readFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	sum := sha256.Sum256(raw)
	c.File = configFile{Path: path, SHA256: hex.EncodeToString(sum[:])}
	return parseFileDoc(c, path, raw)
}

// parseFile applies raw, the YAML text of the file at path, on top of c.
// Every error is a *fileError: it names path, and the line and the field
// where there are ones.
func parseFile(c *config, path string, raw []byte) error {
	_, err := parseFileDoc(c, path, raw)
	return err
}

// parseFileDoc is parseFile that also returns where each field stands,
// for errors found once environment and flags are applied too. The
// settings apply as the walk meets them; then the policies, then Envoy's
// rules, which name the policies.
func parseFileDoc(c *config, path string, raw []byte) (*yamlDoc, error) {
	d := &yamlDoc{path: path, lines: map[string]int{}}
	root, err := d.parseYAML(raw)
	if err != nil {
		return nil, err
	}
	var rules fileRules
	if root != nil {
		if err := d.decodeSection(root, "", fileSchema(settings()), c, &rules); err != nil {
			return nil, err
		}
	}
	if err := rules.applyPolicies(c, d); err != nil {
		return nil, err
	}
	if _, ok := d.lines["envoy"]; ok {
		c.Envoy.Domains = envoyDomains(rules.EnvoyDomains)
		if err := c.Envoy.Validate(c.Policies); err != nil {
			return nil, d.fieldError("", err)
		}
	}
	if _, ok := d.lines["rlqs"]; ok {
		c.RLQS.Domains = rlqsDomains(rules.RLQSDomains)
		if err := c.RLQS.Validate(c.Policies); err != nil {
			return nil, d.fieldError("rlqs", err)
		}
	}
	return d, nil
}

// applyPolicies validates the file's policies and adds them to c.
func (r fileRules) applyPolicies(c *config, d *yamlDoc) error {
	seen := map[string]int{}
	for i, fp := range r.Policies {
		field := fmt.Sprintf("policies[%d]", i)
		p, err := fp.policy()
		if err != nil {
			return d.fieldError(field, err)
		}
		if first, dup := seen[p.Name]; dup {
			line, _ := d.lineOf(field + ".name")
			return d.errorAt(line, field+".name", fmt.Errorf("%w %q (first defined on line %d)", node.ErrDuplicatePolicy, p.Name, first))
		}
		seen[p.Name], _ = d.lineOf(field)
		c.Policies = append(c.Policies, p)
	}
	return nil
}

func (fp filePolicy) policy() (node.Policy, error) {
	if fp.Algorithm == "" {
		return node.Policy{}, errors.New("algorithm: missing")
	}
	a, err := algorithms.ParseAlgorithm(fp.Algorithm)
	if err != nil {
		return node.Policy{}, fmt.Errorf("algorithm: %w", err)
	}
	p := node.Policy{
		Name:  fp.Name,
		Limit: algorithms.Limit{Algorithm: a, Limit: fp.Limit, Period: time.Duration(fp.Period), Burst: fp.Burst},
	}
	if fp.OnStoreError != "" {
		if p.OnStoreError, err = node.ParseFailureMode(fp.OnStoreError); err != nil {
			return node.Policy{}, fmt.Errorf("on_store_error: %w", err)
		}
	}
	if fp.Lease != "" {
		if p.Lease, err = node.ParseLeaseMode(fp.Lease); err != nil {
			return node.Policy{}, err
		}
	}
	// Validated here, where the policy enters: node trusts what NewPolicy
	// built and does not validate it again at start or per check.
	return node.NewPolicy(p)
}
