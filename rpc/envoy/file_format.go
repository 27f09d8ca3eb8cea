package envoy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/yamlbound"
)

// This file is envoyproxy/ratelimit's config file format: the text of one
// file, one domain, parsed into a Domain (File set). The YAML is parsed
// within the bounds of every YAML text quotad reads (yamlbound.Parse) and
// walked by hand rather than decoded into structs, so that every error
// names the file, the line and the descriptor path, and every key the
// format does not have, or quotad does not support, is refused by name.
// Reading the files is cmd/quotad's.

// The keys of the format, where they may appear.
var (
	fileKeys           = []string{"domain", "descriptors"}
	fileDescriptorKeys = []string{"key", "value", "rate_limit", "shadow_mode", "detailed_metric", "value_to_metric",
		"share_threshold", "quota_mode", "metadata", "descriptors"}
	fileRateLimitKeys = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces", "quotad_policy"}
	fileReplacesKeys  = []string{"name"}
)

// fileWalker walks one file's YAML, naming the file in its errors.
type fileWalker struct{ file string }

func (w fileWalker) errorf(n *yaml.Node, path, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return w.errorAt(line, path, fmt.Errorf(format, args...))
}

// errorAt is err at line (none for 0) and path of the file.
func (w fileWalker) errorAt(line int, path string, err error) error {
	where := w.file
	if line > 0 {
		where = fmt.Sprintf("%s: line %d", where, line)
	}
	if path != "" {
		where += ": " + path
	}
	return fmt.Errorf("%s: %w", where, err)
}

// ParseFile parses raw, the text of the envoyproxy/ratelimit config file
// name, as that format: one domain and its descriptors. It checks the
// YAML's shape and keys; the rules' meaning is Compile's to check. Its
// errors name the file, and the line and the descriptor path where there
// are some. nodes is how many YAML nodes raw holds with its aliases
// expanded (yamlbound.Parse), also when the walk fails, so that a caller
// may bound many files together; it is 0 when the YAML itself is refused.
func ParseFile(name string, raw []byte) (d Domain, nodes int, err error) {
	w := fileWalker{file: name}
	root, nodes, err := w.parse(raw)
	if err != nil {
		return Domain{File: name}, 0, err
	}
	d, err = w.domain(root)
	return d, nodes, err
}

// parse parses raw within the bounds of every YAML text quotad reads
// (yamlbound.Parse), and returns its root node and how many nodes that
// holds with its aliases expanded. Its errors name the file.
func (w fileWalker) parse(raw []byte) (*yaml.Node, int, error) {
	root, nodes, err := yamlbound.Parse(raw)
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

// domain walks root, the YAML of the file, into its domain.
func (w fileWalker) domain(root *yaml.Node) (Domain, error) {
	d := Domain{File: w.file}
	err := w.mapping(yamlbound.Resolve(root), "", fileKeys, func(key string, v *yaml.Node) error {
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
func (w fileWalker) descriptors(n *yaml.Node, path string) ([]Descriptor, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, w.errorf(n, path, "want a list of descriptors")
	}
	ds := make([]Descriptor, len(n.Content))
	for i, item := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		item = yamlbound.Resolve(item)
		d := Descriptor{Line: item.Line}
		err := w.mapping(item, p, fileDescriptorKeys, func(key string, v *yaml.Node) error {
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
			case "value_to_metric":
				d.ValueToMetric, err = w.boolean(v, p+".value_to_metric")
			case "share_threshold":
				d.ShareThreshold, err = w.boolean(v, p+".share_threshold")
			case "quota_mode":
				d.QuotaMode, err = w.boolean(v, p+".quota_mode")
			case "metadata":
				d.Metadata, err = w.metadata(v, p+".metadata")
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
func (w fileWalker) rateLimit(n *yaml.Node, path string) (*RateLimit, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	rl := &RateLimit{}
	err := w.mapping(n, path, fileRateLimitKeys, func(key string, v *yaml.Node) error {
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

// metadata parses a metadata mapping at path: any YAML mapping, carried
// into the answers' dynamic metadata (Config.DynamicMetadata); null is
// none.
func (w fileWalker) metadata(n *yaml.Node, path string) (*structpb.Struct, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, w.errorf(n, path, "want a mapping")
	}
	var v map[string]any
	if err := n.Decode(&v); err != nil {
		return nil, w.errorf(n, path, "%v", err)
	}
	st, err := structpb.NewStruct(v)
	if err != nil {
		return nil, w.errorf(n, path, "%v (metadata holds strings, numbers, booleans, lists and mappings with string keys)", err)
	}
	return st, nil
}

// replaces parses a replaces list at path: mappings with a name.
func (w fileWalker) replaces(n *yaml.Node, path string) ([]string, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, w.errorf(n, path, "want a list of {name: ...}")
	}
	names := make([]string, len(n.Content))
	for i, item := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		err := w.mapping(yamlbound.Resolve(item), p, fileReplacesKeys, func(_ string, v *yaml.Node) error {
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
func (w fileWalker) mapping(n *yaml.Node, path string, known []string, each func(key string, v *yaml.Node) error) error {
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
func (w fileWalker) str(n *yaml.Node, path string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", w.errorf(n, path, "want a string")
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

// boolean is the boolean scalar n at path; null is false.
func (w fileWalker) boolean(n *yaml.Node, path string) (bool, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return false, nil
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		return false, w.errorf(n, path, "want true or false, got %q", n.Value)
	}
	return b, nil
}
