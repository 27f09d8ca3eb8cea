// Package yamlbound parses YAML texts within bounds: every YAML text
// quotad reads (the --config file and the files of --envoy-config-dir)
// goes through Parse. Those who walk the parsed nodes (cmd/quotad for the
// config file, rpc/envoy for envoyproxy/ratelimit's files) build their
// values from what Parse returns. yaml.v3 keeps an alias as a pointer to
// the node it names, so a parsed document is as small as its text; it is a
// walker that follows the aliases which would build each named node again
// at every reference, 2^n times for n levels of lists naming the previous
// level twice. So the expanded size is counted here, on the parsed nodes,
// once for each node named, before any walker runs.
//
// The package is pure: it reads no file, and imports only yaml.v3 and the
// standard library.
package yamlbound

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

const (
	// MaxBytes is the longest YAML text Parse takes: 1 MiB, the most
	// quotad reads of one file.
	MaxBytes = 1 << 20
	// MaxNodes is the most nodes (keys, values, lists and mappings)
	// one YAML file may hold with its aliases expanded.
	MaxNodes = 100_000
	// MaxDepth is the deepest one YAML file may nest, with its aliases
	// expanded; the top-level mapping is level 1.
	MaxDepth = 64
	// maxSyntaxSearchBytes is the longest YAML text in which
	// syntaxErrorLine looks for the line of a syntax error; a longer one
	// (a generated file, which no one indents by hand) gets the line
	// yaml.v3 reports. Each look parses the text again: up to 17 parses
	// of 64 KiB take milliseconds, 20 of 1 MiB seconds.
	maxSyntaxSearchBytes = 64 << 10
)

// Error is what Parse refuses in a YAML text: where and what.
// Callers add the file's name.
type Error struct {
	// Line is the 1-based line; 0 when the problem has no one line.
	Line int
	// Field is where the problem is in the document, with its aliases
	// expanded (envoy.domains[0].descriptors[3]); empty for the text as a
	// whole.
	Field string
	// Err is the problem.
	Err error
}

// Error reads "line 4: descriptors[0].descriptors: <problem>".
func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// ErrSecondDocument is a YAML text with more than one document (---).
var ErrSecondDocument = errors.New("a second YAML document")

// Parse parses raw, a YAML text of at most MaxBytes, and returns
// the root node of its one document (nil for an empty text, or one of
// comments only) and how many nodes that holds with its aliases expanded.
// It refuses, with a *Error: a longer text; a syntax error, at the
// line of the mistake (syntaxErrorLine); a second document
// (ErrSecondDocument, at its line); and a document that, with its aliases
// expanded, holds more than MaxNodes nodes or nests deeper than
// MaxDepth, or has an alias inside the node it names. It takes time
// and memory in proportion to raw, whatever the aliases, so that a
// walker may follow the aliases of what it returns.
func Parse(raw []byte) (*yaml.Node, int, error) {
	if len(raw) > MaxBytes {
		return nil, 0, &Error{Err: fmt.Errorf("larger than %d bytes (1 MiB), the most quotad reads of one file", MaxBytes)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, 0, nil
		}
		return nil, 0, syntaxError(raw, err)
	}
	var more yaml.Node
	switch err := dec.Decode(&more); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, 0, syntaxError(raw, err)
	default:
		return nil, 0, &Error{Line: more.Line, Err: ErrSecondDocument}
	}
	if len(doc.Content) == 0 {
		return nil, 0, nil
	}
	root := doc.Content[0]
	c := expansion{sizes: map[*yaml.Node]expanded{}, open: map[*yaml.Node]bool{}}
	size, err := c.count(root, 1)
	if err != nil {
		return nil, 0, err
	}
	return root, size.nodes, nil
}

// expanded is the size of a node with its aliases expanded: its nodes and
// its height (1 for a scalar).
type expanded struct{ nodes, height int }

// expansion counts a document's nodes with its aliases expanded, counting
// each node an alias names once: sizes holds those counted (anchored
// nodes), open those being counted.
type expansion struct {
	sizes map[*yaml.Node]expanded
	open  map[*yaml.Node]bool
}

// count returns the expanded size of n, which is at depth (1 at the
// root), or a *Error at the node where the expansion passes a bound,
// whose Field is the path to it. An error returns as soon as a bound is
// passed, so the count never goes past MaxNodes nor its recursion
// past MaxDepth.
func (c *expansion) count(n *yaml.Node, depth int) (expanded, error) {
	if n.Kind == yaml.AliasNode {
		target := n.Alias
		if c.open[target] {
			return expanded{}, &Error{Line: n.Line, Err: fmt.Errorf("alias *%s is inside the node it names (line %d), which would make it endless", n.Value, target.Line)}
		}
		s, ok := c.sizes[target]
		if !ok {
			var err error
			if s, err = c.count(target, depth); err != nil {
				return expanded{}, err
			}
		}
		if depth+s.height-1 > MaxDepth {
			return expanded{}, &Error{Line: n.Line, Err: errTooDeep}
		}
		return s, nil
	}
	if depth > MaxDepth {
		return expanded{}, &Error{Line: n.Line, Err: errTooDeep}
	}
	if n.Anchor != "" {
		if s, ok := c.sizes[n]; ok {
			return s, nil
		}
		c.open[n] = true
		defer delete(c.open, n)
	}
	s := expanded{nodes: 1, height: 1}
	for i, child := range n.Content {
		cs, err := c.count(child, depth+1)
		if err == nil {
			s.nodes += cs.nodes
			s.height = max(s.height, cs.height+1)
			if s.nodes > MaxNodes {
				err = &Error{Line: child.Line, Err: errTooManyNodes}
			}
		}
		if err != nil {
			var ye *Error
			if errors.As(err, &ye) {
				ye.Field = joinYAMLField(childField(n, i), ye.Field)
			}
			return expanded{}, err
		}
	}
	if n.Anchor != "" {
		c.sizes[n] = s
	}
	return s, nil
}

var (
	errTooManyNodes = fmt.Errorf("more than %d YAML nodes (keys, values, lists and mappings, with aliases expanded), the most one file may hold", MaxNodes)
	errTooDeep      = fmt.Errorf("nested deeper than %d levels (with aliases expanded), the most one file may nest", MaxDepth)
)

// childField names the i-th of n's Content as the walkers do: a mapping's
// value by its key, a list's item by its index ([i]); a mapping's key, or
// anything else, by nothing.
func childField(n *yaml.Node, i int) string {
	switch {
	case n.Kind == yaml.SequenceNode:
		return "[" + strconv.Itoa(i) + "]"
	case n.Kind == yaml.MappingNode && i%2 == 1:
		return n.Content[i-1].Value
	}
	return ""
}

// joinYAMLField puts field below parent: "a" and "[2].b" make "a[2].b",
// "a" and "b" make "a.b".
func joinYAMLField(parent, field string) string {
	switch {
	case parent == "":
		return field
	case field == "":
		return parent
	case strings.HasPrefix(field, "["):
		return parent + field
	}
	return parent + "." + field
}

// yamlLinePrefix is how yaml.v3 starts an error that knows its line.
var yamlLinePrefix = regexp.MustCompile(`^yaml: (line (\d+): )?`)

// syntaxError turns yaml.v3's syntax error in raw into a *Error at the
// line the mistake is on (syntaxErrorLine), or, in a text longer than
// maxSyntaxSearchBytes, at the line yaml.v3 reports.
func syntaxError(raw []byte, err error) *Error {
	msg := yamlLinePrefix.ReplaceAllString(err.Error(), "")
	line := 0
	if len(raw) <= maxSyntaxSearchBytes {
		line = syntaxErrorLine(raw, msg)
	}
	if line == 0 {
		if m := yamlLinePrefix.FindStringSubmatch(err.Error()); m != nil && m[2] != "" {
			line, _ = strconv.Atoi(m[2])
		}
	}
	return &Error{Line: line, Err: fmt.Errorf("YAML syntax: %s", msg)}
}

// syntaxErrorLine finds the line of a YAML syntax error whose message,
// without yaml.v3's "yaml: line N: ", is msg. yaml.v3 reports the line
// where the enclosing block starts rather than where the mistake is (a bad
// indent on line 7 of a mapping that starts on line 1 reads "line 1"), so
// it looks for the fewest lines from the top that give the same error:
// the mistake is on the last of them. A parser stops at the first mistake,
// so every longer prefix gives that error too, and the search halves the
// lines it looks at each time: about log2(lines) parses, not one per line.
// It returns 0 if the error never appears that way.
func syntaxErrorLine(raw []byte, msg string) int {
	var ends []int // ends[i] is where line i+1 ends
	for i, b := range raw {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(ends) == 0 || ends[len(ends)-1] != len(raw) {
		ends = append(ends, len(raw))
	}
	fails := func(lines int) bool {
		err := parseAllYAML(raw[:ends[lines-1]])
		return err != nil && yamlLinePrefix.ReplaceAllString(err.Error(), "") == msg
	}
	lo, hi := 1, len(ends)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if !fails(lo) {
		return 0
	}
	return lo
}

// parseAllYAML parses every document of b, for its syntax error.
func parseAllYAML(b []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// Resolve follows a YAML alias to the node it names.
func Resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}
