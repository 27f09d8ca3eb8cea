package memory

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/metric"

	"github.com/quotad/quotad/node"
)

// This file is the memory store's metrics: how full it is
// (docs/observability.md).

var _ node.InstrumentedStore = (*Store)(nil)

// Instrument implements node.InstrumentedStore: with a meter in t, the
// store reports quotad.memory_store.keys, .max_keys and .refusals at each
// collection, until it closes. Its calls are in process and not traced.
func (s *Store) Instrument(t node.Telemetry) error {
	meter := t.Meter()
	if meter == nil {
		return nil
	}
	keys, err := meter.Int64ObservableGauge("quotad.memory_store.keys", metric.WithUnit("{key}"),
		metric.WithDescription("States the embedded memory store holds (one per key and algorithm, expired ones until swept); it refuses new keys at quotad.memory_store.max_keys."))
	if err != nil {
		return fmt.Errorf("quotad.memory_store.keys: %w", err)
	}
	maxKeys, err := meter.Int64ObservableGauge("quotad.memory_store.max_keys", metric.WithUnit("{key}"),
		metric.WithDescription("The most states the embedded memory store holds."))
	if err != nil {
		return fmt.Errorf("quotad.memory_store.max_keys: %w", err)
	}
	refused, err := meter.Int64ObservableCounter("quotad.memory_store.refusals", metric.WithUnit("{check}"),
		metric.WithDescription("Checks refused with ResourceExhausted because the memory store was full."))
	if err != nil {
		return fmt.Errorf("quotad.memory_store.refusals: %w", err)
	}
	reg, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(keys, int64(s.Len()))
		o.ObserveInt64(maxKeys, int64(s.MaxKeys()))
		o.ObserveInt64(refused, s.Refused())
		return nil
	}, keys, maxKeys, refused)
	if err != nil {
		return fmt.Errorf("register the memory store's instruments: %w", err)
	}
	s.unregister = sync.OnceFunc(func() { _ = reg.Unregister() }) // fails only if already unregistered
	return nil
}
