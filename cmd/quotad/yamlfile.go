package main

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/quotad/quotad/yamlbound"
)

// This file reads the YAML config file strictly, with errors a user can
// act on. yaml.v3 parses the text into nodes; quotad's own walker then
// applies the settings from the nodes by the settings table
// (configfile.go), and fills the structs of the policies and Envoy's rules
// by their yaml tags, so that every error names the file, the line and the
// field as the file spells it (policies[0].limit), and no Go type name
// reaches the user. Unknown fields, a fraction where a whole number
// belongs and a value of the wrong kind are errors, never ignored or
// truncated.

// fileError is a problem in the config file: where it is and what it is.
type fileError struct {
	// Path is the file.
	Path string
	// Line is the 1-based line; 0 when the problem has no one line.
	Line int
	// Field is the setting as the file spells it (redis.url,
	// policies[0].limit); empty for a syntax error.
	Field string
	// Err is the problem.
	Err error
}

// Error reads "config q.yaml: line 4: policies[0].limit: want a whole
// number, got 100.5".
func (e *fileError) Error() string {
	return "config " + e.Path + ": " + (&yamlbound.Error{Line: e.Line, Field: e.Field, Err: e.Err}).Error()
}

func (e *fileError) Unwrap() error { return e.Err }

// yamlDoc is one config file being read: its path and the line of every
// field it sets, by field path ("redis.url", "policies[0]").
type yamlDoc struct {
	path  string
	lines map[string]int
}

// errorAt is the fileError at line about field.
func (d *yamlDoc) errorAt(line int, field string, err error) *fileError {
	return &fileError{Path: d.path, Line: line, Field: field, Err: err}
}

// lineOf returns the line of field, or of its nearest ancestor the file
// sets, and which of them that is; 0 and "" when none is set.
func (d *yamlDoc) lineOf(field string) (int, string) {
	for f := field; f != ""; f = parentField(f) {
		if l, ok := d.lines[f]; ok {
			return l, f
		}
	}
	return 0, ""
}

// parentField is field without its last step: "a.b[2].c" → "a.b[2]" →
// "a.b" → "a" → "".
func parentField(field string) string {
	i := strings.LastIndexAny(field, ".[")
	if i < 0 {
		return ""
	}
	return field[:i]
}

// parseYAML parses raw, the text of the config file, into its one
// document's root node (nil for an empty file), by the bounds every YAML
// text quotad reads is held to (yamlbound.Parse).
func (d *yamlDoc) parseYAML(raw []byte) (*yaml.Node, error) {
	root, _, err := yamlbound.Parse(raw)
	var ye *yamlbound.Error
	if errors.As(err, &ye) {
		if errors.Is(ye.Err, yamlbound.ErrSecondDocument) {
			ye.Err = errors.New("a second YAML document; put every setting in one")
		}
		return nil, d.errorAt(ye.Line, ye.Field, ye.Err)
	}
	return root, err
}

// nodeDecoder is a file type that reads its own node (durations, address
// lists). Its errors say what is wrong with the value; the walker adds the
// line and the field.
type nodeDecoder interface {
	decodeNode(n *yaml.Node) error
}

var nodeDecoderType = reflect.TypeFor[nodeDecoder]()

// decode sets v, a file struct or a field of one, from n, whose field path
// is field. Pointers are allocated for the values the file sets, so that
// nil means "not in the file".
func (d *yamlDoc) decode(n *yaml.Node, field string, v reflect.Value) error {
	n = valueNode(n)
	if n == nil {
		return nil
	}
	if v.Kind() == reflect.Pointer {
		p := reflect.New(v.Type().Elem())
		if err := d.decode(n, field, p.Elem()); err != nil {
			return err
		}
		v.Set(p)
		return nil
	}
	if v.CanAddr() && v.Addr().Type().Implements(nodeDecoderType) {
		if err := v.Addr().Interface().(nodeDecoder).decodeNode(n); err != nil {
			return d.errorAt(n.Line, field, err)
		}
		return nil
	}
	switch v.Kind() {
	case reflect.Struct:
		return d.decodeMapping(n, field, v)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return d.errorAt(n.Line, field, fmt.Errorf("want a list, got %s", describeNode(n)))
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			f := fmt.Sprintf("%s[%d]", field, i)
			d.lines[f] = item.Line
			if err := d.decode(item, f, s.Index(i)); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.String:
		s, err := yamlText(n)
		if err != nil {
			return d.errorAt(n.Line, field, err)
		}
		v.SetString(s)
		return nil
	case reflect.Bool:
		b, err := yamlBool(n)
		if err != nil {
			return d.errorAt(n.Line, field, err)
		}
		v.SetBool(b)
		return nil
	case reflect.Int, reflect.Int64:
		i, err := wholeNumber(n)
		if err == nil && v.OverflowInt(i) {
			err = fmt.Errorf("%d is too large", i)
		}
		if err != nil {
			return d.errorAt(n.Line, field, err)
		}
		v.SetInt(i)
		return nil
	case reflect.Float64:
		f, err := yamlNumber(n)
		if err != nil {
			return d.errorAt(n.Line, field, err)
		}
		v.SetFloat(f)
		return nil
	}
	// Only a file struct quotad declares with a field of another kind gets
	// here; its tests would fail first.
	return d.errorAt(n.Line, field, fmt.Errorf("quotad cannot read this setting (a %s field)", v.Kind()))
}

// valueNode follows n's alias, if it is one, to the node that holds the
// value; nil for null ("key:" with no value, or "~"), as if the key were
// not there. yamlbound.Parse bounded what following aliases can reach.
func valueNode(n *yaml.Node) *yaml.Node {
	n = yamlbound.Resolve(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	return n
}

// unknownField is the error of key k, which the mapping at field (the
// top level for "") does not know; known lists the keys it does.
func (d *yamlDoc) unknownField(k *yaml.Node, field string, known []string) *fileError {
	where := "at the top level"
	if field != "" {
		where = "in " + field
	}
	return d.errorAt(k.Line, joinField(field, k.Value), fmt.Errorf("unknown field %s (known: %s)", where, strings.Join(known, ", ")))
}

// wholeNumber reads n as a whole number. A fraction is an error, never
// rounded or truncated; a float that is whole (1e6, 100.0) is accepted.
func wholeNumber(n *yaml.Node) (int64, error) {
	if n.Kind == yaml.ScalarNode {
		switch n.Tag {
		case "!!int":
			var i int64
			if err := n.Decode(&i); err != nil {
				return 0, fmt.Errorf("want a whole number from %d to %d, got %s", int64(math.MinInt64), int64(math.MaxInt64), n.Value)
			}
			return i, nil
		case "!!float":
			var f float64
			if err := n.Decode(&f); err == nil && f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
				return int64(f), nil
			}
			return 0, fmt.Errorf("want a whole number, got %s (quotad never rounds a setting)", n.Value)
		}
	}
	return 0, fmt.Errorf("want a whole number, got %s", describeNode(n))
}

// describeNode says what n is, for "want X, got Y".
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return strconv.Quote(n.Value)
}

// decodeMapping sets the struct v from the mapping n: each key must be
// one of v's yaml tags, once.
func (d *yamlDoc) decodeMapping(n *yaml.Node, field string, v reflect.Value) error {
	fields, names := yamlFields(v.Type())
	if n.Kind != yaml.MappingNode {
		return d.errorAt(n.Line, field, fmt.Errorf("want a mapping of %s, got %s", strings.Join(names, ", "), describeNode(n)))
	}
	pairs, err := d.mappingPairs(n, field)
	if err != nil {
		return err
	}
	seen := map[string]int{}
	for _, kv := range pairs {
		k, val := kv[0], kv[1]
		name := joinField(field, k.Value)
		idx, ok := fields[k.Value]
		if !ok {
			return d.unknownField(k, field, names)
		}
		if first, dup := seen[k.Value]; dup {
			return d.errorAt(k.Line, name, fmt.Errorf("given twice (first on line %d)", first))
		}
		seen[k.Value] = k.Line
		d.lines[name] = k.Line
		if err := d.decode(val, name, v.Field(idx)); err != nil {
			return err
		}
	}
	return nil
}

// mappingPairs lists n's key and value nodes. A YAML merge key (<<: *a)
// adds the keys of the mappings it names that n does not set itself.
func (d *yamlDoc) mappingPairs(n *yaml.Node, field string) ([][2]*yaml.Node, error) {
	var own, merged [][2]*yaml.Node
	set := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, d.errorAt(k.Line, field, fmt.Errorf("a key must be a name, got %s", describeNode(k)))
		}
		if k.Tag != "!!merge" {
			own = append(own, [2]*yaml.Node{k, val})
			set[k.Value] = true
			continue
		}
		sources := []*yaml.Node{val}
		if resolved := yamlbound.Resolve(val); resolved.Kind == yaml.SequenceNode {
			sources = resolved.Content
		}
		for _, src := range sources {
			src = yamlbound.Resolve(src)
			if src.Kind != yaml.MappingNode {
				return nil, d.errorAt(k.Line, field, errors.New("<< must name a mapping or a list of mappings"))
			}
			pairs, err := d.mappingPairs(src, field)
			if err != nil {
				return nil, err
			}
			merged = append(merged, pairs...)
		}
	}
	for _, kv := range merged {
		if !set[kv[0].Value] {
			own = append(own, kv)
			set[kv[0].Value] = true
		}
	}
	return own, nil
}

func joinField(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// yamlFields maps the yaml tag names of struct type t to field indexes,
// and lists the names in the order of the fields.
func yamlFields(t reflect.Type) (map[string]int, []string) {
	byName := make(map[string]int, t.NumField())
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			byName[name] = i
			names = append(names, name)
		}
	}
	return byName, names
}
