package yamlbound

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// listBomb is a YAML text of n levels of lists each naming the previous
// level's list twice: about 20 bytes a level, 2^n scalars expanded.
func listBomb(n int) string {
	var b strings.Builder
	b.WriteString("l0: &l0 [x, x]\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "l%d: &l%d [*l%d, *l%d]\n", i, i, i-1, i-1)
	}
	return b.String()
}

// Parse counts nodes with aliases expanded, and refuses, naming the
// line and the field where the bound is passed, what passes
// MaxNodes or MaxDepth, an alias inside what it names, and a text
// over MaxBytes.
func TestParseYAMLBounds(t *testing.T) {
	// A mapping (1) of 2 keys and 2 lists of 3 nodes, the second an alias.
	if _, n, err := Parse([]byte("a: &a [x, y]\nb: *a\n")); err != nil || n != 9 {
		t.Errorf("nodes %d, %v; want 9", n, err)
	}
	flow := func(items int) []byte {
		return []byte("[" + strings.TrimSuffix(strings.Repeat("x,", items), ",") + "]")
	}
	if _, n, err := Parse(flow(MaxNodes - 1)); err != nil || n != MaxNodes {
		t.Errorf("a list of %d: nodes %d, %v; want %d and no error", MaxNodes-1, n, err, MaxNodes)
	}
	nested := func(levels int) []byte {
		return []byte(strings.Repeat("[", levels-1) + "x" + strings.Repeat("]", levels-1))
	}
	if _, _, err := Parse(nested(MaxDepth)); err != nil {
		t.Errorf("%d levels: %v", MaxDepth, err)
	}
	deepAlias := "a: &a " + strings.Repeat("[", 40) + "x" + strings.Repeat("]", 40) + "\nb: " + strings.Repeat("[", 30) + "*a" + strings.Repeat("]", 30) + "\n"
	for _, tc := range []struct {
		name, text string
		want       string
	}{
		{"a list of 100000", string(flow(MaxNodes)), "line 1: [99999]: more than 100000 YAML nodes (keys, values, lists and mappings, with aliases expanded), the most one file may hold"},
		{"lists naming lists", listBomb(40), "line 15: l14: more than 100000 YAML nodes"},
		{"nested lists", string(nested(MaxDepth + 1)), "line 1: " + strings.Repeat("[0]", MaxDepth) + ": nested deeper than 64 levels (with aliases expanded), the most one file may nest"},
		{"an alias nested deeper", deepAlias, "line 2: b" + strings.Repeat("[0]", 30) + ": nested deeper than 64 levels"},
		{"an alias inside what it names", "a: &a [x, *a]\n", "line 1: a[1]: alias *a is inside the node it names (line 1), which would make it endless"},
		{"merge keys naming merges", "a: &a {x: 1, y: 2}\n" + func() string {
			var b strings.Builder
			for i := 1; i <= 30; i++ {
				fmt.Fprintf(&b, "m%d: &m%d {<<: [*%s, *%s]}\n", i, i, map[bool]string{true: "a", false: fmt.Sprintf("m%d", i-1)}[i == 1], map[bool]string{true: "a", false: fmt.Sprintf("m%d", i-1)}[i == 1])
			}
			return b.String()
		}(), "more than 100000 YAML nodes"},
		{"over 1 MiB", "# " + strings.Repeat("x", MaxBytes), "larger than 1048576 bytes (1 MiB), the most quotad reads of one file"},
		{"a second document", "a: 1\n---\nb: 2\n", "line 2: a second YAML document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Parse([]byte(tc.text))
			var ye *Error
			if !errors.As(err, &ye) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want %q", err, tc.want)
			}
		})
	}
}

// The line of a syntax error deep in a file of up to 64 KiB is found (by
// halving the lines parsed, not by parsing every prefix); in a longer
// file, it is the line yaml.v3 reports.
func TestSyntaxErrorLineInALargeFile(t *testing.T) {
	policies := func(n int) string {
		var b strings.Builder
		b.WriteString("policies:\n")
		for i := range n {
			fmt.Fprintf(&b, "  - name: p%d\n    algorithm: fixed_window\n    limit: 10\n    period: 1s\n", i)
		}
		return b.String()
	}
	for _, tc := range []struct {
		text, want string
	}{
		{policies(800) + " bad: x\n", "line 3202: YAML syntax: did not find expected key"},
		{policies(10_000) + " bad: x\n", "line 40001: YAML syntax: did not find expected key"},
	} {
		_, _, err := Parse([]byte(tc.text))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%d bytes: %v, want %q", len(tc.text), err, tc.want)
		}
	}
}
