package envoy

import "strings"

// This file finds the rule for a descriptor and names the counter it spends.

// match returns the rule for a descriptor with entries es in the tree whose
// first level is l, or nil when no rule applies (or l is nil). It walks the
// entries in order: at each level, the rule naming the entry's key and
// value wins; failing that, the first rule (in configured order) whose
// wildcard value ("foo*", "bar*b", "foo*bar*baz") matches the entry's
// value; failing that, the key's default (the rule with no value). The entry after it is matched among the
// winner's children. The rule applies only when the last entry lands on it,
// so a descriptor longer or shorter than the rules has no limit. There is
// no backtracking: once a rule wins an entry, the others are not tried for
// the entries after. These are envoyproxy/ratelimit's rules.
func (l *ruleLevel) match(es []entry) *rule {
	r, _ := l.matchCounted(es)
	return r
}

// matchCounted is match, and the entries the descriptor is counted by: es,
// or a copy whose entries that a share_threshold rule matched have that
// rule's wildcard pattern for their value, so that every value it matches
// shares one counter.
func (l *ruleLevel) matchCounted(es []entry) (*rule, []entry) {
	lvl, counted := l, es
	for i, e := range es {
		if lvl == nil {
			return nil, es
		}
		n := lvl.find(e)
		if n == nil {
			return nil, es
		}
		if n.share != "" {
			if &counted[0] == &es[0] {
				counted = append([]entry(nil), es...)
			}
			counted[i].value = n.share
		}
		if i == len(es)-1 {
			return n.rule, counted
		}
		lvl = n.next
	}
	return nil, es
}

// find returns the rule at l that matches e, or nil.
func (l *ruleLevel) find(e entry) *ruleNode {
	n, _ := l.findHow(e)
	return n
}

// How a rule matched an entry.
const (
	byExactValue = iota
	byWildcard
	byDefault
)

// findHow is find, and how the rule matched.
func (l *ruleLevel) findHow(e entry) (*ruleNode, int) {
	if n := l.exact[e]; n != nil {
		return n, byExactValue
	}
	for _, w := range l.wildcards {
		if w.key == e.key && w.matches(e.value) {
			return w.node, byWildcard
		}
	}
	return l.defaults[e.key], byDefault
}

// metricPath is the name envoyproxy/ratelimit gives, with value_to_metric,
// the statistics of a descriptor with entries es that matches a rule from
// l (match): each entry's key, joined by '.', with "_" and a value where
// the rule it matched says: the value a rule names (key_value); for a
// wildcard rule, the pattern (share_threshold's too), or the entry's own
// value if the rule sets value_to_metric; for a key's default rule, the
// entry's value if it sets value_to_metric, else none. So
// route=api, http_method=GET, subject_id=123 under default rules with
// value_to_metric on route and http_method is
// "route_api.http_method_GET.subject_id".
func (l *ruleLevel) metricPath(es []entry) string {
	var b strings.Builder
	lvl := l
	for i, e := range es {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.key)
		var n *ruleNode
		how := byDefault
		if lvl != nil {
			n, how = lvl.findHow(e)
		}
		if n == nil {
			lvl = nil
			continue
		}
		value := ""
		switch {
		case how == byExactValue:
			value = e.value
		case how == byWildcard && n.share != "":
			value = n.share
		case n.valueToMetric:
			value = e.value
		case how == byWildcard:
			value = n.pattern
		}
		if value != "" {
			b.WriteByte('_')
			b.WriteString(value)
		}
		lvl = n.next
	}
	return b.String()
}

// counterKey is the key a descriptor's counter has under its rule's policy:
// the domain, then every entry as key=value, joined by '|', e.g.
// "edge|remote_address=10.0.0.1|path=/api". Every value counts, the
// default rules' included, so each address has a counter of its own. '%',
// '|' and '=' inside the parts are percent-escaped, so that no two
// descriptors share a key: a value cannot pose as more entries.
func counterKey(domain string, es []entry) string {
	n := len(domain)
	for _, e := range es {
		n += len(e.key) + len(e.value) + 2
	}
	b := make([]byte, 0, n)
	b = appendKeyPart(b, domain)
	for _, e := range es {
		b = append(b, '|')
		b = appendKeyPart(b, e.key)
		b = append(b, '=')
		b = appendKeyPart(b, e.value)
	}
	return string(b)
}

func appendKeyPart(b []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '|', '=':
			b = append(b, '%', hex[c>>4], hex[c&0xF])
		default:
			b = append(b, c)
		}
	}
	return b
}
