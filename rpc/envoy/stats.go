package envoy

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
)

// This file keeps envoyproxy/ratelimit's per-rule statistics (total_hits,
// over_limit, near_limit, within_limit, shadow_mode) as OpenTelemetry
// counters, which /metrics shows as quotad_envoy_*_total. Their labels come
// from the configuration only: the domain and the rule; a detailed_metric
// rule adds the descriptor's entries, capped per rule.

// maxDetails bounds the distinct detail labels of one detailed_metric
// rule; later descriptors count under otherDetail.
const maxDetails = 100

const otherDetail = "(other)"

// Attributes of the statistics.
const (
	attrDomain = attribute.Key("quotad.envoy.domain")
	attrRule   = attribute.Key("quotad.envoy.rule")
	attrDetail = attribute.Key("quotad.envoy.detail")
)

// ruleStat names a rule in the statistics: its domain and
// envoyproxy/ratelimit's name for it (the rules' keys from the top, each
// key or key_value, joined by '.': "message_type_marketing.to_number").
type ruleStat struct {
	attrs attribute.Set
	// details is set for detailed_metric and value_to_metric rules: the
	// detail labels given out so far.
	details *details
	// byValue: the detail is the rule's name with value_to_metric's
	// runtime values (ruleLevel.metricPath), not the descriptor's entries.
	byValue bool
}

func newRuleStat(domain, rule string, detailed bool) ruleStat {
	k := ruleStat{attrs: attribute.NewSet(attrDomain.String(domain), attrRule.String(rule))}
	if detailed {
		k.details = &details{seen: map[string]struct{}{}}
	}
	return k
}

// details is a detailed_metric rule's detail labels. It is safe for
// concurrent use.
type details struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// label returns detail if it is one of the first maxDetails distinct
// details asked for, else otherDetail.
func (d *details) label(detail string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.seen[detail]; ok {
		return detail
	}
	if len(d.seen) >= maxDetails {
		return otherDetail
	}
	d.seen[detail] = struct{}{}
	return detail
}

// detailOf is envoyproxy/ratelimit's detailed name of a descriptor: its
// entries as key_value, joined by '.' ("key1_unspecified_value").
func detailOf(es []entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.key)
		b.WriteByte('_')
		b.WriteString(e.value)
	}
	return b.String()
}

// stats are the service's counters. They are safe for concurrent use.
type stats struct {
	hits, overLimit, nearLimit, withinLimit, shadowMode metric.Int64Counter
	// globalShadowMode counts requests whose OVER_LIMIT the global shadow
	// mode turned into OK; domainNotFound requests for a domain that is not
	// configured (answered OK in drop-in mode).
	globalShadowMode, domainNotFound metric.Int64Counter
}

// newStats makes the counters with mp; nil means no metrics.
func newStats(mp metric.MeterProvider) (*stats, error) {
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter("github.com/quotad/quotad/rpc/envoy")
	s := &stats{}
	for _, c := range []struct {
		dst               *metric.Int64Counter
		name, unit, about string
	}{
		{&s.hits, "quotad.envoy.hits", "{hit}", "hits of an Envoy rate limit rule (envoyproxy/ratelimit's total_hits)"},
		{&s.overLimit, "quotad.envoy.over_limit", "{hit}", "hits over an Envoy rate limit rule's limit"},
		{&s.nearLimit, "quotad.envoy.near_limit", "{hit}", "hits above the near-limit ratio of an Envoy rate limit rule's limit, but not over it"},
		{&s.withinLimit, "quotad.envoy.within_limit", "{hit}", "hits within an Envoy rate limit rule's limit"},
		{&s.shadowMode, "quotad.envoy.shadow_mode", "{hit}", "hits over the limit of a shadow_mode rule, answered OK"},
		{&s.globalShadowMode, "quotad.envoy.global_shadow_mode", "{request}", "requests over the limit answered OK by the global shadow mode"},
		{&s.domainNotFound, "quotad.envoy.domain_not_found", "{request}", "requests naming a domain that is not configured"},
	} {
		var err error
		if *c.dst, err = m.Int64Counter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.about)); err != nil {
			return nil, fmt.Errorf("telemetry: %w", err)
		}
	}
	return s, nil
}

// outcome is what the statistics need of one decided descriptor, in
// envoyproxy/ratelimit's terms: its counter goes from before to
// before+hits (even when over the limit: that is how that project counts),
// and it is over the limit past limit.
type outcome struct {
	hits, before, limit uint64
	over                bool
	// unspent: the hits fitted, but were not spent because another
	// descriptor of an all_or_nothing request was over its limit. They
	// count as hits only, neither within nor over the limit.
	unspent bool
}

// record counts one decided descriptor of the rule named st (unlimited,
// or shadow_mode, as the rule is), whose entries were es (path: its name
// under value_to_metric, see ruleLevel.metricPath), as
// envoyproxy/ratelimit does: every hit is a hit; the hits past the
// limit are over_limit, those past the near-limit threshold (nearRatio of
// the limit, rounded down) but not past the limit near_limit, and the rest
// of an admitted request's within_limit; an over-the-limit shadow_mode rule
// counts its hits in shadow_mode too.
func (s *stats) record(ctx context.Context, st ruleStat, unlimited, shadow bool, es []entry, path string, nearRatio float64, o outcome) {
	if o.hits == 0 {
		return
	}
	attrs := metric.WithAttributeSet(st.attrs)
	if st.details != nil {
		detail := detailOf(es)
		if st.byValue {
			detail = path
		}
		label := st.details.label(detail)
		kvs := append(st.attrs.ToSlice(), attrDetail.String(label))
		attrs = metric.WithAttributeSet(attribute.NewSet(kvs...))
	}
	add := func(c metric.Int64Counter, n uint64) {
		if n > 0 {
			c.Add(ctx, int64(min(n, math.MaxInt64)), attrs)
		}
	}
	add(s.hits, o.hits)
	if unlimited || o.unspent {
		return
	}
	near := uint64(math.Floor(float64(o.limit) * nearRatio))
	after := o.before + o.hits
	if o.over {
		if o.before >= o.limit || after <= o.limit {
			add(s.overLimit, o.hits)
		} else {
			// Only the hits past the limit are over it; those before it,
			// past the near-limit threshold, are near it.
			add(s.overLimit, after-o.limit)
			add(s.nearLimit, o.limit-max(near, o.before))
		}
		if shadow {
			add(s.shadowMode, o.hits)
		}
		return
	}
	add(s.withinLimit, o.hits)
	if after > near {
		add(s.nearLimit, after-max(near, o.before))
	}
}
