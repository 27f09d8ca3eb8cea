package rlqs

import (
	"slices"
	"strings"

	"github.com/quotad/quotad/node"
)

// This file finds a bucket's rule: the domains compiled into lookups, the
// first rule whose pattern matches the bucket id, and the counter key the
// id counts under.

// rules are a Config's domains, compiled against the policies. Immutable.
type rules struct {
	domains map[string]*domainRules
}

type domainRules struct {
	name     string
	buckets  []compiledRule
	fallback resolved
}

type compiledRule struct {
	match map[string]string
	to    resolved
}

// resolved is a Target with its policy looked up: a limited bucket when
// limited, else the blanket action.
type resolved struct {
	limited bool
	policy  node.Policy
	// allow is the blanket action of an unlimited target: true ALLOW_ALL,
	// false DENY_ALL.
	allow bool
	// rule names the target in metrics and /status: the policy's name,
	// or the action.
	rule string
}

// compile builds the rules of c, which Validate has accepted.
func compile(c Config, policies []node.Policy) *rules {
	byName := map[string]node.Policy{}
	for _, p := range policies {
		byName[p.Name] = p
	}
	resolve := func(t Target) resolved {
		if t.Policy != "" {
			return resolved{limited: true, policy: byName[t.Policy], rule: t.Policy}
		}
		if t.Action == ActionAllowAll {
			return resolved{allow: true, rule: ActionAllowAll}
		}
		return resolved{rule: ActionDenyAll}
	}
	rs := &rules{domains: map[string]*domainRules{}}
	for _, d := range c.Domains {
		dr := &domainRules{name: d.Name, fallback: resolve(d.Default)}
		for _, r := range d.Buckets {
			dr.buckets = append(dr.buckets, compiledRule{match: r.Bucket, to: resolve(r.Target)})
		}
		rs.domains[d.Name] = dr
	}
	return rs
}

// match returns what the bucket id of domain gets, and false for a
// domain that is not configured.
func (rs *rules) match(domain string, id map[string]string) (resolved, bool) {
	d, ok := rs.domains[domain]
	if !ok {
		return resolved{}, false
	}
	for _, r := range d.buckets {
		if matches(r.match, id) {
			return r.to, true
		}
	}
	return d.fallback, true
}

// matches reports whether id has every key of pattern with a value the
// pattern's value matches.
func matches(pattern, id map[string]string) bool {
	for k, want := range pattern {
		got, ok := id[k]
		if !ok || !valueMatches(want, got) {
			return false
		}
	}
	return true
}

// valueMatches matches value against pattern, where each `*` stands for
// any run of characters, none included.
func valueMatches(pattern, value string) bool {
	if !strings.Contains(pattern, "*") {
		return pattern == value
	}
	parts := strings.Split(pattern, "*")
	if !strings.HasPrefix(value, parts[0]) {
		return false
	}
	value = value[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(value, p)
		if i < 0 {
			return false
		}
		value = value[i+len(p):]
	}
	return strings.HasSuffix(value, last)
}

// counterKey is the key a bucket id of domain counts under at its policy:
// domain|key=value|... with the keys in order and `%`, `|` and `=` inside
// them escaped as %25, %7C and %3D, as Envoy's rate limit service writes
// its descriptors' keys.
func counterKey(domain string, id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(escapeKeyPart(domain))
	for _, k := range keys {
		b.WriteByte('|')
		b.WriteString(escapeKeyPart(k))
		b.WriteByte('=')
		b.WriteString(escapeKeyPart(id[k]))
	}
	return b.String()
}

var keyEscaper = strings.NewReplacer("%", "%25", "|", "%7C", "=", "%3D")

func escapeKeyPart(s string) string { return keyEscaper.Replace(s) }
