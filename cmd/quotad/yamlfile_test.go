package main

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// goTypeName matches what a Go type looks like in a message: a package-
// qualified name, a slice, map or pointer type, a sized number type, or
// yaml.v3's tags.
var goTypeName = regexp.MustCompile(`\b(main|node|rpc|algorithms|cache)\.[A-Za-z]|\[\][a-z*]|map\[|\*[a-z]+\.|\b(u?int(8|16|32|64)?|float(32|64)|struct \{)\b|!!`)

// leafFields lists every setting of the file struct t as a YAML document
// that sets it to %s, with the field path: "policies:\n  - limit: %s\n"
// for policies[0].limit. Recursive sections stop at depth 3.
func leafFields(t reflect.Type, indent, prefix, path string, depth int) map[string]string {
	out := map[string]string{}
	names, order := yamlFields(t)
	_ = names
	for _, name := range order {
		ft := t.Field(names[name]).Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		field := joinField(path, name)
		line := prefix + indent + name + ":"
		switch {
		case ft.Kind() == reflect.Struct && depth < 3:
			for f, doc := range leafFields(ft, indent+"  ", line+"\n", field, depth+1) {
				out[f] = doc
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct && depth < 3:
			// The item's first field goes on the "- " line.
			for f, doc := range leafFields(ft.Elem(), indent+"    ", line+"\n"+indent+"  - _: 0\n", field+"[0]", depth+1) {
				out[f] = strings.Replace(doc, indent+"  - _: 0\n"+indent+"    ", indent+"  - ", 1)
			}
		default:
			out[field] = line + " %s\n"
		}
	}
	return out
}

// schemaType is the config file's schema (fileSchema) as a struct type
// with yaml tags, for leafFields: a setting is a text field, a section a
// struct, a list of rules its slice type.
func schemaType(sec *fileSection) reflect.Type {
	var fields []reflect.StructField
	for i, name := range sec.names {
		t := reflect.TypeFor[string]()
		switch e := sec.keys[name]; {
		case e.section != nil:
			t = schemaType(e.section)
		case e.list != nil:
			t = reflect.TypeOf(e.list(&fileRules{})).Elem()
		}
		fields = append(fields, reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: t, Tag: reflect.StructTag(fmt.Sprintf("yaml:%q", name))})
	}
	return reflect.StructOf(fields)
}

// Every setting of the file, given a value of every wrong kind, is refused
// with a fileError that names the file, a line and the field, in words: no
// Go type name, no yaml.v3 tag.
func TestConfigFileErrorsNameFileLineAndFieldInWords(t *testing.T) {
	docs := leafFields(schemaType(fileSchema(settings())), "", "", "", 0)
	if len(docs) < 45 {
		t.Fatalf("only %d settings found in the config file's schema", len(docs))
	}
	bad := []string{`"text"`, "1.5", "[a, b]", "{a: 1}", "-7", "true", "12345678901234567890123"}
	refused := 0
	for field, doc := range docs {
		for _, v := range bad {
			text := fmt.Sprintf(doc, v)
			c := defaultConfig()
			err := parseFile(&c, "q.yaml", []byte(text))
			if err == nil {
				continue // a valid value for this setting (-7 for a number, "text" for text)
			}
			refused++
			var fe *fileError
			if !errors.As(err, &fe) {
				t.Errorf("%s = %s: error %q is not a fileError", field, v, err)
				continue
			}
			if fe.Path != "q.yaml" || fe.Line == 0 || fe.Field == "" {
				t.Errorf("%s = %s: %q lacks the file, the line or the field", field, v, err)
			}
			if m := goTypeName.FindString(err.Error()); m != "" {
				t.Errorf("%s = %s: %q shows a Go type (%q)", field, v, err, m)
			}
		}
	}
	t.Logf("%d settings, %d refused values checked", len(docs), refused)
}

// The file walker accepts what YAML allows: whole numbers written as
// floats, anchors and aliases, merge keys, and null as "not set".
func TestConfigFileYAMLFeatures(t *testing.T) {
	c := defaultConfig()
	err := parseFile(&c, "q.yaml", []byte(`
base: &base {algorithm: gcra, period: 1s}
`))
	if err == nil || !strings.Contains(err.Error(), "line 2: base: unknown field") {
		t.Fatalf("unknown top-level anchor holder: %v", err)
	}
	c = defaultConfig()
	err = parseFile(&c, "q.yaml", []byte(`
max_batch: 1e3
shutdown_timeout: ~
policies:
  - &base {name: a, algorithm: gcra, limit: 1e6, period: 1s}
  - <<: *base
    name: b
    limit: 5
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxBatch != 1000 || c.ShutdownTimeout != 10*time.Second || len(c.Policies) != 2 ||
		c.Policies[0].Limit.Limit != 1_000_000 || c.Policies[1].Name != "b" || c.Policies[1].Limit.Limit != 5 || c.Policies[1].Limit.Period != time.Second {
		t.Fatalf("max_batch %d, shutdown_timeout %s, policies %+v", c.MaxBatch, c.ShutdownTimeout, c.Policies)
	}
}

// syntaxErrorLine finds the line a mistake is on where yaml.v3 names the
// line its block starts on.
func TestSyntaxErrorsPointAtTheirLine(t *testing.T) {
	for _, tc := range []struct {
		text string
		line int
	}{
		{"a: b\nc:\n  - x\n  - y\n - z\n", 5},
		{"policies:\n  - name: a\n    algorithm: gcra\n    limit: 5\n   period: 1s\n", 5},
		{"a: \"multi\n  line\"\nb: c\n   bad: x\n", 4},
		{"a: [x,\n  y]\nb: c\n  d: e\n", 4},
		{"key: value\nother: {a: 1, b\n", 2},
		{"a:\n\tb: c\n", 2},
		{"- a\nb: c\n", 2},
	} {
		c := defaultConfig()
		err := parseFile(&c, "q.yaml", []byte(tc.text))
		var fe *fileError
		if !errors.As(err, &fe) || fe.Line != tc.line || !strings.Contains(err.Error(), "YAML syntax") {
			t.Errorf("%q: %v, want a YAML syntax error on line %d", tc.text, err, tc.line)
		}
	}
}
