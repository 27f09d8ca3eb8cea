package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// This file rewrites the names of the statistics sent to DogStatsD
// (--statsd-mogrifiers), as envoyproxy/ratelimit's DogStatsD sink does
// with its mogrifiers (src/godogstats): the first whose pattern matches a
// name replaces it by its name template and adds its tags, "$1" and the
// like standing for the pattern's groups.

// statsdMogrifierSpec is one mogrifier as --statsd-mogrifiers gives it,
// in JSON: {"pattern": "^ratelimit\\.service\\.rate_limit\\.([^.]+)\\.(.*)\\.([^.]+)$",
// "name": "ratelimit.service.rate_limit.$3", "tags": {"domain": "$1"}}.
type statsdMogrifierSpec struct {
	Pattern string            `json:"pattern"`
	Name    string            `json:"name"`
	Tags    map[string]string `json:"tags,omitempty"`
}

// statsdMogrifier is a mogrifier ready to run.
type statsdMogrifier struct {
	pattern *regexp.Regexp
	name    string
	// tags are sorted by key: DogStatsD's order, fixed.
	tags []statsdTag
}

// statsdGroupRef finds "$1" and the like in a template.
var statsdGroupRef = regexp.MustCompile(`\$\d+`)

// parseStatsdMogrifiers reads --statsd-mogrifiers: a JSON array of
// statsdMogrifierSpec, tried in order. Empty means none.
func parseStatsdMogrifiers(s string) ([]statsdMogrifier, error) {
	if s == "" {
		return nil, nil
	}
	var specs []statsdMogrifierSpec
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&specs); err != nil {
		return nil, fmt.Errorf(`want a JSON array of {"pattern": "regexp", "name": "template", "tags": {"key": "template"}}: %w`, err)
	}
	out := make([]statsdMogrifier, 0, len(specs))
	for i, sp := range specs {
		if sp.Pattern == "" || sp.Name == "" {
			return nil, fmt.Errorf("mogrifier %d: a pattern and a name are both needed", i+1)
		}
		re, err := regexp.Compile(sp.Pattern)
		if err != nil {
			return nil, fmt.Errorf("mogrifier %d: pattern %q: %w", i+1, sp.Pattern, err)
		}
		m := statsdMogrifier{pattern: re, name: sp.Name}
		for k, v := range sp.Tags {
			if k == "" || v == "" {
				return nil, fmt.Errorf("mogrifier %d: tag %q:%q: a tag needs a key and a value", i+1, k, v)
			}
			m.tags = append(m.tags, statsdTag{k, v})
		}
		slices.SortFunc(m.tags, func(a, b statsdTag) int { return strings.Compare(a.key, b.key) })
		out = append(out, m)
	}
	return out, nil
}

// mogrify returns name as the first of ms whose pattern matches it
// rewrites it, and the tags that one adds (key:value); name itself and no
// tags when none matches.
func mogrify(ms []statsdMogrifier, name string) (string, []string) {
	for _, m := range ms {
		groups := m.pattern.FindStringSubmatch(name)
		if groups == nil {
			continue
		}
		fill := func(template string) string {
			return statsdGroupRef.ReplaceAllStringFunc(template, func(ref string) string {
				i, err := strconv.Atoi(ref[1:])
				if err != nil || i >= len(groups) {
					return ref // as upstream: a group the pattern lacks stays as written
				}
				return groups[i]
			})
		}
		tags := make([]string, 0, len(m.tags))
		for _, t := range m.tags {
			tags = append(tags, t.key+":"+fill(t.value))
		}
		return fill(m.name), tags
	}
	return name, nil
}
