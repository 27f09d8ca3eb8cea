package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/rpc/envoy"
	"github.com/quotad/quotad/yamlbound"
)

// This file loads a directory of envoyproxy/ratelimit config files
// (--envoy-config-dir), unchanged: each *.yaml or *.yml file is one domain
// in that project's format, which envoy.Domain (File set) carries. The
// YAML is walked by hand rather than decoded into structs, so that every
// error names the file, the line and the descriptor path, and every key the
// format does not have, or quotad does not support, is refused by name.

// envoyFile is one config file: its name in the directory and its text.
type envoyFile struct {
	name string
	raw  []byte
}

// The bounds of an envoy config dir as a whole; each file is bounded as
// every file quotad reads (readFileBy) and every YAML text (yamlbound.Parse).
const (
	// maxEnvoyDirBytes is the most its config files may hold in all:
	// 4 MiB.
	maxEnvoyDirBytes = 4 * maxFileBytes
	// maxEnvoyDirNodes is the most YAML nodes, with aliases expanded,
	// its config files may hold in all.
	maxEnvoyDirNodes = 4 * yamlbound.MaxNodes
)

// readEnvoyFiles reads dir's config files, sorted by name: the files named
// *.yaml or *.yml (symbolic links followed), as every file quotad reads
// (readFileBy), all within fileReadTimeout and maxEnvoyDirBytes. Names
// starting with '.' are skipped, as Kubernetes' ConfigMap volumes keep
// their real files under "..data"; other files and subdirectories are not
// config files. A config file that is not a regular file (a named pipe) is
// refused.
func readEnvoyFiles(dir string) ([]envoyFile, error) {
	deadline := time.Now().Add(fileReadTimeout)
	entries, err := readDirBy(dir, deadline)
	if err != nil {
		return nil, err
	}
	var files []envoyFile
	total := 0
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || (filepath.Ext(name) != ".yaml" && filepath.Ext(name) != ".yml") {
			continue
		}
		path := filepath.Join(dir, name)
		// Stat never waits on a named pipe; readFileBy refuses one.
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			continue
		}
		raw, err := readFileBy(path, deadline)
		if err != nil {
			return nil, err
		}
		if total += len(raw); total > maxEnvoyDirBytes {
			return nil, fmt.Errorf("%s: its config files hold more than %d bytes (4 MiB) in all, the most quotad reads of one directory", dir, maxEnvoyDirBytes)
		}
		files = append(files, envoyFile{name: name, raw: raw})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	return files, nil
}

// envoyRules compiles the Envoy rules quotad serves with configuration c:
// the config file's envoy section and, when c.EnvoyDir is set, the domains
// of files, the directory's config files (readEnvoyFiles). It is a pure
// function of its arguments; hot reload (reload.go) calls it with the new
// configuration, then rpc.Handler.SetRules. nil rules (and
// no error) mean Envoy's rate limit service is not configured.
func (c config) envoyRules(files []envoyFile) (*envoy.Rules, error) {
	ec := c.Envoy
	if c.EnvoyDir == "" {
		if len(ec.Domains) == 0 {
			return nil, nil
		}
		rules, err := envoy.Compile(ec, c.Policies)
		if err != nil {
			return nil, fmt.Errorf("envoy: %w", err)
		}
		return rules, nil
	}
	ec.DropIn = true
	ec.Domains = slices.Clone(ec.Domains)
	nodes := 0
	for _, f := range files {
		root, n, err := f.parse()
		if err == nil && nodes+n > maxEnvoyDirNodes {
			err = fmt.Errorf("%s: the directory's config files hold more than %d YAML nodes (with aliases expanded) in all, the most quotad reads of one directory", f.name, maxEnvoyDirNodes)
		}
		if err != nil {
			return nil, fmt.Errorf("envoy config dir %s: %w", c.EnvoyDir, err)
		}
		nodes += n
		d, err := f.domain(root)
		if err != nil {
			return nil, fmt.Errorf("envoy config dir %s: %w", c.EnvoyDir, err)
		}
		ec.Domains = append(ec.Domains, d)
	}
	rules, err := envoy.Compile(ec, c.Policies)
	if err != nil {
		return nil, fmt.Errorf("envoy config dir %s: %w", c.EnvoyDir, err)
	}
	return rules, nil
}

// The keys of the format, where they may appear. envoyUnsupported are keys
// of envoyproxy/ratelimit that quotad refuses rather than ignore.
var (
	envoyFileKeys       = []string{"domain", "descriptors"}
	envoyDescriptorKeys = []string{"key", "value", "rate_limit", "shadow_mode", "detailed_metric", "descriptors"}
	envoyRateLimitKeys  = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "quotad_policy"}
	envoyReplacesKeys   = []string{"name"}
	envoyUnsupported    = map[string]string{
		"share_threshold": "quotad counts every value a wildcard matches separately; see docs/envoy.md",
		"value_to_metric": "quotad's statistics label rules from the config only, and detailed_metric values; see docs/envoy.md",
	}
)

// envoyWalker walks one file's YAML, naming the file in its errors.
type envoyWalker struct{ file string }

func (w envoyWalker) errorf(n *yaml.Node, path, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return w.errorAt(line, path, fmt.Errorf(format, args...))
}

// errorAt is err at line (none for 0) and path of the file.
func (w envoyWalker) errorAt(line int, path string, err error) error {
	where := w.file
	if line > 0 {
		where = fmt.Sprintf("%s: line %d", where, line)
	}
	if path != "" {
		where += ": " + path
	}
	return fmt.Errorf("%s: %w", where, err)
}

// parseEnvoyFile parses f as an envoyproxy/ratelimit config file: one
// domain and its descriptors. It checks the YAML's shape and keys; the
// rules' meaning is envoy.Compile's to check.
func parseEnvoyFile(f envoyFile) (envoy.Domain, error) {
	root, _, err := f.parse()
	if err != nil {
		return envoy.Domain{File: f.name}, err
	}
	return f.domain(root)
}

// parse parses f's YAML within the bounds of every YAML text quotad reads
// (yamlbound.Parse), and returns its root node and how many nodes that holds
// with its aliases expanded. Its errors name the file.
func (f envoyFile) parse() (*yaml.Node, int, error) {
	w := envoyWalker{file: f.name}
	root, nodes, err := yamlbound.Parse(f.raw)
	var ye *yamlbound.Error
	if errors.As(err, &ye) {
		if errors.Is(ye.Err, yamlbound.ErrSecondDocument) {
			ye.Err = errors.New("a second YAML document; one file holds one domain")
		}
		return nil, 0, w.errorAt(ye.Line, ye.Field, ye.Err)
	}
	if err == nil && root == nil {
		err = w.errorf(nil, "", "empty: a config file needs a domain")
	}
	return root, nodes, err
}

// domain walks root, the YAML of f, into its domain.
func (f envoyFile) domain(root *yaml.Node) (envoy.Domain, error) {
	w := envoyWalker{file: f.name}
	d := envoy.Domain{File: f.name}
	err := w.mapping(yamlbound.Resolve(root), "", envoyFileKeys, func(key string, v *yaml.Node) error {
		var err error
		switch key {
		case "domain":
			d.Domain, err = w.str(v, "domain")
		case "descriptors":
			d.Descriptors, err = w.descriptors(v, "descriptors")
		}
		return err
	})
	return d, err
}

// descriptors parses a list of descriptors at path.
func (w envoyWalker) descriptors(n *yaml.Node, path string) ([]envoy.Descriptor, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, w.errorf(n, path, "want a list of descriptors")
	}
	ds := make([]envoy.Descriptor, len(n.Content))
	for i, item := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		item = yamlbound.Resolve(item)
		d := envoy.Descriptor{Line: item.Line}
		err := w.mapping(item, p, envoyDescriptorKeys, func(key string, v *yaml.Node) error {
			var err error
			switch key {
			case "key":
				d.Key, err = w.str(v, p+".key")
			case "value":
				d.Value, err = w.str(v, p+".value")
			case "shadow_mode":
				d.ShadowMode, err = w.boolean(v, p+".shadow_mode")
			case "detailed_metric":
				d.DetailedMetric, err = w.boolean(v, p+".detailed_metric")
			case "rate_limit":
				d.RateLimit, err = w.rateLimit(v, p+".rate_limit")
			case "descriptors":
				d.Descriptors, err = w.descriptors(v, p+".descriptors")
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		ds[i] = d
	}
	return ds, nil
}

// rateLimit parses a rate_limit block at path; null means none.
func (w envoyWalker) rateLimit(n *yaml.Node, path string) (*envoy.RateLimit, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	rl := &envoy.RateLimit{}
	err := w.mapping(n, path, envoyRateLimitKeys, func(key string, v *yaml.Node) error {
		var err error
		switch key {
		case "unit":
			rl.Unit, err = w.str(v, path+".unit")
		case "requests_per_unit":
			var u uint32
			if err = v.Decode(&u); err != nil || v.Kind != yaml.ScalarNode {
				return w.errorf(v, path+".requests_per_unit", "want a whole number from 0 to 4294967295, got %q", v.Value)
			}
			rl.RequestsPerUnit = &u
		case "unlimited":
			rl.Unlimited, err = w.boolean(v, path+".unlimited")
		case "name":
			rl.Name, err = w.str(v, path+".name")
		case "quotad_policy":
			rl.Policy, err = w.str(v, path+".quotad_policy")
		case "replaces":
			rl.Replaces, err = w.replaces(v, path+".replaces")
		}
		return err
	})
	return rl, err
}

// replaces parses a replaces list at path: mappings with a name.
func (w envoyWalker) replaces(n *yaml.Node, path string) ([]string, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, w.errorf(n, path, "want a list of {name: ...}")
	}
	names := make([]string, len(n.Content))
	for i, item := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		err := w.mapping(yamlbound.Resolve(item), p, envoyReplacesKeys, func(_ string, v *yaml.Node) error {
			var err error
			names[i], err = w.str(v, p+".name")
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return names, nil
}

// mapping calls each for every key of the mapping n at path, refusing keys
// not in known, and keys written twice.
func (w envoyWalker) mapping(n *yaml.Node, path string, known []string, each func(key string, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return w.errorf(n, path, "want a mapping with the keys %s", strings.Join(known, ", "))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], yamlbound.Resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return w.errorf(k, path, "a key must be a string")
		}
		key := k.Value
		at := key
		if path != "" {
			at = path + "." + key
		}
		if why, ok := envoyUnsupported[key]; ok {
			return w.errorf(k, at, "envoyproxy/ratelimit's %s is not supported by quotad (%s)", key, why)
		}
		if !slices.Contains(known, key) {
			return w.errorf(k, at, "unknown key %q (the keys here are %s)", key, strings.Join(known, ", "))
		}
		if seen[key] {
			return w.errorf(k, at, "written twice")
		}
		seen[key] = true
		if err := each(key, v); err != nil {
			return err
		}
	}
	return nil
}

// str is the text of the scalar n at path; null is "". Like
// envoyproxy/ratelimit, it takes any scalar as written (value: 500 is
// "500").
func (w envoyWalker) str(n *yaml.Node, path string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", w.errorf(n, path, "want a string")
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

// boolean is the boolean scalar n at path; null is false.
func (w envoyWalker) boolean(n *yaml.Node, path string) (bool, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return false, nil
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		return false, w.errorf(n, path, "want true or false, got %q", n.Value)
	}
	return b, nil
}

// loadEnvoy reads and compiles the Envoy rules of c (config.envoyRules),
// and returns the switch Envoy's rate limit service is to read them from
// (nil when it is not configured) and the directory's files it read.
func loadEnvoy(c config) (*envoy.Switch, []envoyFile, error) {
	var files []envoyFile
	if c.EnvoyDir != "" {
		var err error
		if files, err = readEnvoyFiles(c.EnvoyDir); err != nil {
			return nil, nil, fmt.Errorf("envoy config dir: %w", err)
		}
	}
	rules, err := c.envoyRules(files)
	if err != nil || rules == nil {
		return nil, files, err
	}
	return envoy.NewSwitch(rules), files, nil
}

// describeEnvoy says what Envoy's rate limit service serves, for the
// startup banner; "" when it is not configured.
func describeEnvoy(c config, sw *envoy.Switch) string {
	if sw == nil {
		return ""
	}
	s := "envoy: rate limit service for domains " + strings.Join(sw.Rules().Domains(), ", ")
	if c.EnvoyDir != "" {
		s += fmt.Sprintf(" (files of %s, checked for changes every %s)", c.EnvoyDir, configPollInterval)
	}
	if c.Envoy.ShadowMode {
		s += "; global shadow mode: never OVER_LIMIT overall"
	}
	return s
}

// envoyFilesHash identifies a set of files by their names and contents.
func envoyFilesHash(files []envoyFile) [sha256.Size]byte {
	h := sha256.New()
	for _, f := range files {
		// Lengths first, so that no two sets of files hash alike by
		// shifting bytes between a name and a content.
		var n [16]byte
		for i, v := range []int{len(f.name), len(f.raw)} {
			for j := 0; j < 8; j++ {
				n[i*8+j] = byte(v >> (8 * j))
			}
		}
		h.Write(n[:])
		h.Write([]byte(f.name))
		h.Write(f.raw)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
