package rlqs

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// This file exports the service's figures as OpenTelemetry instruments,
// read when metrics are collected; /metrics shows them as quotad_rlqs_*.
// Their labels come from the configuration only: the domain and the
// rule (a policy's name, allow_all or deny_all), so the series are
// bounded by the rules.

// Attributes of the metrics.
const (
	attrDomain  = attribute.Key("quotad.rlqs.domain")
	attrRule    = attribute.Key("quotad.rlqs.rule")
	attrOutcome = attribute.Key("quotad.rlqs.outcome")
)

// ruleID names a rule in the metrics.
type ruleID struct{ domain, rule string }

// ruleFigures are what a rule's buckets reported, in all.
type ruleFigures struct{ allowed, denied uint64 }

// instrument registers the service's instruments with mp and returns
// the registration's end. The caller holds no lock.
func (s *Service) instrument(mp metric.MeterProvider) (func() error, error) {
	m := mp.Meter("github.com/quotad/quotad/rpc/rlqs")
	requests, err := m.Int64ObservableCounter("quotad.rlqs.requests", metric.WithUnit("{request}"),
		metric.WithDescription("requests Envoys reported for the rate limit quota buckets of a rule, by outcome (allowed, denied)"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	assigned, err := m.Float64ObservableGauge("quotad.rlqs.assigned_rate", metric.WithUnit("{unit}/s"),
		metric.WithDescription("rate this member assigned, in its last round, to the Envoy buckets of a rule's policy, in all"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	buckets, err := m.Int64ObservableGauge("quotad.rlqs.buckets", metric.WithUnit("{bucket}"),
		metric.WithDescription("Envoy buckets this member serves for a rule"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	streams, err := m.Int64ObservableGauge("quotad.rlqs.streams", metric.WithUnit("{stream}"),
		metric.WithDescription("Envoy rate limit quota streams open on this member (one per Envoy)"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	calls, err := m.Int64ObservableCounter("quotad.rlqs.store_calls", metric.WithUnit("{call}"),
		metric.WithDescription("store calls of the rounds: one share exchange per limit per round, and one charge when its buckets reported requests allowed"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		for id, f := range s.figures {
			o.ObserveInt64(requests, int64(f.allowed), metric.WithAttributes(attrDomain.String(id.domain), attrRule.String(id.rule), attrOutcome.String("allowed")))
			o.ObserveInt64(requests, int64(f.denied), metric.WithAttributes(attrDomain.String(id.domain), attrRule.String(id.rule), attrOutcome.String("denied")))
		}
		rates := map[ruleID]float64{}
		counts := map[ruleID]int64{}
		for st := range s.streams {
			for _, b := range st.buckets {
				id := ruleID{st.domain, b.to.rule}
				counts[id]++
				if _, ok := rates[id]; !ok && b.to.limited {
					rates[id] = 0
				}
			}
		}
		for _, l := range s.limits {
			id := ruleID{l.domain, l.policy.Name}
			rates[id] += l.assigned
		}
		for id, r := range rates {
			o.ObserveFloat64(assigned, r, metric.WithAttributes(attrDomain.String(id.domain), attrRule.String(id.rule)))
		}
		for id, n := range counts {
			o.ObserveInt64(buckets, n, metric.WithAttributes(attrDomain.String(id.domain), attrRule.String(id.rule)))
		}
		o.ObserveInt64(streams, int64(len(s.streams)))
		o.ObserveInt64(calls, int64(s.stats.exchanges+s.stats.charges))
		return nil
	}, requests, assigned, buckets, streams, calls)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	return reg.Unregister, nil
}
