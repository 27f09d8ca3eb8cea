package node

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// This file is the node's spans and metrics: Telemetry, the quotad.check
// span and the observable counters of leases, the denied cache, the
// breaker and the cluster.

// Telemetry is where a node sends traces and metrics, through the
// OpenTelemetry API (the SDK and exporters are the caller's). The zero value
// sends nothing and adds nothing to the check path.
//
// Spans: every Check is a span "quotad.check", a child of the span in its
// context, and the Redis script call a check makes is its child "EVALSHA".
// Metrics: decisions, check latency, Redis call latency and errors, lease
// and denied-cache counters, breaker state and cluster size. Names and
// attributes are listed in docs/observability.md.
type Telemetry struct {
	// TracerProvider makes the node's tracer. nil (or the API's noop
	// provider) means no spans.
	TracerProvider trace.TracerProvider
	// MeterProvider makes the node's meter. nil (or the API's noop
	// provider) means no metrics.
	MeterProvider metric.MeterProvider
}

// Names of the node's spans and attributes (docs/observability.md).
const (
	instrumentationName = "github.com/quotad/quotad/node"
	checkSpanName       = "quotad.check"

	attrPolicy    = attribute.Key("quotad.policy")
	attrAlgorithm = attribute.Key("quotad.algorithm")
	attrCost      = attribute.Key("quotad.cost")
	attrAllowed   = attribute.Key("quotad.allowed")
	attrSource    = attribute.Key("quotad.source")
	attrOutcome   = attribute.Key("quotad.outcome")
)

// maxPolicyLabels bounds the distinct quotad.policy values of
// quotad.decisions. Inline limits let clients pick policy names, and each
// name is a time series per outcome and source; names past the bound are
// counted under otherPolicyLabel. Configured policies always have their own.
const maxPolicyLabels = 1000

// otherPolicyLabel can never be a policy's name (policy names are
// [A-Za-z0-9_.-]), so it cannot be confused with one.
const otherPolicyLabel = "(other)"

// sourceSlots sizes arrays indexed by Source: room for the five sources
// and a few more. A source beyond it is counted in slot 0 as "unknown".
const sourceSlots = 8

// sourceSlot is s's index in arrays of sourceSlots.
func sourceSlot(s Source) int {
	if s > 0 && int(s) < sourceSlots {
		return int(s)
	}
	return 0
}

// sourceLabel is the quotad.source value of slot i.
func sourceLabel(i int) string {
	if i == 0 {
		return "unknown"
	}
	return Source(i).String()
}

// Bucket boundaries in seconds. A check answered locally takes about a
// microsecond, one that calls Redis about a millisecond on a LAN; the
// OpenTelemetry defaults (0 to 10,000, meant for milliseconds) would put
// every check in the first bucket.
var (
	checkDurationBuckets = []float64{1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}
)

// telemetry is a node's instruments. A nil tracer means no spans; a nil
// checkDuration means no metrics. Safe for concurrent use.
type telemetry struct {
	tracer trace.Tracer

	checkDuration metric.Float64Histogram
	// bySource holds the precomputed options of checkDuration per source
	// slot, so that recording allocates nothing.
	bySource [sourceSlots][]metric.RecordOption
	// decisions reports the node's decision counts (Node.decisions) at
	// each collection. An observable counter costs a check one atomic add,
	// where a synchronous one costs about as much as the whole lease hit.
	decisions metric.Int64ObservableCounter

	registration metric.Registration
}

// observed reports whether checks are traced or measured at all; when not,
// Check takes the bare path.
func (t *telemetry) observed() bool { return t.tracer != nil || t.checkDuration != nil }

// newTelemetry makes n's instruments and registers the observable ones,
// which read n's counters at each collection.
func newTelemetry(cfg Telemetry, n *Node) (*telemetry, error) {
	t := &telemetry{tracer: cfg.Tracer()}
	if meter := cfg.Meter(); meter != nil {
		if err := t.instrument(meter, n); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Tracer is the tracer of the node's instrumentation scope, which its
// store's spans share; nil when t sends no spans (no provider, or the
// API's noop one).
func (t Telemetry) Tracer() trace.Tracer {
	if tp := t.TracerProvider; tp != nil {
		if _, noop := tp.(tracenoop.TracerProvider); !noop {
			return tp.Tracer(instrumentationName)
		}
	}
	return nil
}

// Meter is the meter of the node's instrumentation scope, which its
// store's metrics share; nil when t sends no metrics (no provider, or the
// API's noop one).
func (t Telemetry) Meter() metric.Meter {
	if mp := t.MeterProvider; mp != nil {
		if _, noop := mp.(metricnoop.MeterProvider); !noop {
			return mp.Meter(instrumentationName)
		}
	}
	return nil
}

// instrument creates the metric instruments on meter.
func (t *telemetry) instrument(meter metric.Meter, n *Node) error {
	var err error
	if t.checkDuration, err = meter.Float64Histogram("quotad.check.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to decide a check, by source."),
		metric.WithExplicitBucketBoundaries(checkDurationBuckets...)); err != nil {
		return fmt.Errorf("quotad.check.duration: %w", err)
	}
	for i := range sourceSlots {
		t.bySource[i] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attrSource.String(sourceLabel(i))))}
	}
	if t.decisions, err = meter.Int64ObservableCounter("quotad.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Checks decided, by policy, outcome (allowed or denied) and source (who decided).")); err != nil {
		return fmt.Errorf("quotad.decisions: %w", err)
	}

	type observable struct {
		name, unit, desc string
		gauge            bool
		value            func() int64
		inst             metric.Int64Observable
	}
	// The breaker has no half-open state (an open one probes with pings,
	// not with checks), so the gauge is 0 or 2; 1 stays free for one.
	breakerState := func() int64 {
		if n.StoreAvailable() {
			return 0
		}
		return 2
	}
	obs := []*observable{
		{name: "quotad.lease.grants", unit: "{grant}", desc: "Leases taken from the store (grants of more than the checking request's cost).", value: n.stats.leasesGranted.Load},
		{name: "quotad.lease.units.leased", unit: "{unit}", desc: "Units taken in leases beyond the granting checks' own cost.", value: n.stats.unitsLeased.Load},
		{name: "quotad.lease.units.returned", unit: "{unit}", desc: "Leased units given back to the store unused.", value: n.stats.unitsReturned.Load},
		{name: "quotad.lease.hits", unit: "{check}", desc: "Checks answered from a lease.", value: n.stats.leaseHits.Load},
		{name: "quotad.denied_cache.hits", unit: "{check}", desc: "Checks answered by a remembered denial.", value: n.stats.deniedCacheHits.Load},
		{name: "quotad.denied_cache.additions", unit: "{denial}", desc: "Store denials remembered for later checks.", value: n.stats.denialsCached.Load},
		{name: "quotad.lease.units.held", unit: "{unit}", desc: "Units this node's leases hold now.", gauge: true, value: func() int64 { return n.local.figures().unitsHeld }},
		{name: "quotad.store.state_losses", unit: "{event}", desc: "Times the store's state changed under the node (a Redis restart, failover or flush) and it dropped its leases and cached denials.", value: n.stats.storeStateLosses.Load},
		{name: "quotad.client_lease.grants", unit: "{grant}", desc: "Leases granted to clients (AcquireLease) to spend in their own processes.", value: func() int64 { return n.local.clientLeaseStats().Granted }},
		{name: "quotad.client_lease.units.leased", unit: "{unit}", desc: "Units granted in client leases (beyond the granting checks' own cost).", value: func() int64 { return n.local.clientLeaseStats().UnitsGranted }},
		{name: "quotad.client_lease.units.returned", unit: "{unit}", desc: "Client-leased units given back to the store unused (ReturnLease).", value: func() int64 { return n.local.clientLeaseStats().UnitsReturned }},
		{name: "quotad.client_lease.outstanding", unit: "{grant}", desc: "Client leases this node remembers now: neither returned nor forgotten after they expired.", gauge: true, value: func() int64 { return int64(n.local.clientLeaseStats().Grants) }},
		{name: "quotad.client_lease.units.held", unit: "{unit}", desc: "Units of the client leases this node remembers now, spent or not.", gauge: true, value: func() int64 { return n.local.clientLeaseStats().UnitsHeld }},
		{name: "quotad.lease.keys", unit: "{key}", desc: "Keys this node tracks for leasing (remote stores only).", gauge: true, value: func() int64 { return n.local.figures().leaseKeys }},
		{name: "quotad.lease.table_full", unit: "{check}", desc: "Checks of untracked keys that found the lease table full and went to the store without a lease or coalescing.", value: func() int64 { return n.local.figures().tableFull }},
		{name: "quotad.store.late_units.returned", unit: "{unit}", desc: "Units given back after a store call's reply came too late for its caller, whose answer had not spent them.", value: n.stats.lateTakesReturned.Load},
		{name: "quotad.store.overloads", unit: "{call}", desc: "Store calls whose deadline passed inside the node while Redis answered: their checks were shed as overloaded, not answered by a failure mode.", value: n.storeOverloads},
		// A state has no unit: unit "1" would make Prometheus call it a
		// ratio (quotad_breaker_state_ratio).
		{name: "quotad.breaker.refusals", unit: "{call}", desc: "Store calls the open circuit breaker refused without trying: their checks took their policy's failure mode.", value: n.breakerRefusals},
		{name: "quotad.breaker.state", desc: "Redis circuit breaker: 0 closed, 1 half-open, 2 open.", gauge: true, value: breakerState},
		{name: "quotad.cluster.members", unit: "{node}", desc: "Nodes sharing the store, as the node sizes leases by.", gauge: true, value: func() int64 { return int64(n.cluster.Size()) }},
	}
	insts := make([]metric.Observable, len(obs), len(obs)+1)
	for i, o := range obs {
		if o.gauge {
			o.inst, err = meter.Int64ObservableGauge(o.name, metric.WithUnit(o.unit), metric.WithDescription(o.desc))
		} else {
			o.inst, err = meter.Int64ObservableCounter(o.name, metric.WithUnit(o.unit), metric.WithDescription(o.desc))
		}
		if err != nil {
			return fmt.Errorf("%s: %w", o.name, err)
		}
		insts[i] = o.inst
	}
	t.registration, err = meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		for _, o := range obs {
			ob.ObserveInt64(o.inst, o.value())
		}
		n.decisions.observe(ob, t.decisions)
		return nil
	}, append(insts, t.decisions)...)
	if err != nil {
		return fmt.Errorf("register observable instruments: %w", err)
	}
	return nil
}

// close stops the observable instruments from reading the node.
func (t *telemetry) close() {
	if t.registration != nil {
		_ = t.registration.Unregister() // only fails if already unregistered
	}
}

// checkObserved is check inside a span, counted and timed. Nothing here
// waits on an exporter: spans end into the provider's processor (a
// batching one never blocks), and instruments aggregate in memory.
func (n *Node) checkObserved(ctx context.Context, p Policy, key string, cost int64, o CheckOptions) (Result, error) {
	t := n.tel
	start := time.Now()
	var span trace.Span
	if t.tracer != nil {
		// Attributes are set after Start, and only on a recording span: a
		// span the sampler drops then costs no attribute slices. (quotad's
		// samplers do not look at attributes.)
		ctx, span = t.tracer.Start(ctx, checkSpanName)
	}
	res, err := n.check(ctx, p, key, cost, o)
	if span != nil {
		if span.IsRecording() {
			span.SetAttributes(attrPolicy.String(p.Name), attrAlgorithm.String(p.Limit.Algorithm.String()), attrCost.Int64(cost))
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			} else {
				span.SetAttributes(attrAllowed.Bool(res.Allowed), attrSource.String(res.Source.String()))
			}
		}
		span.End()
	}
	if t.checkDuration != nil && err == nil {
		t.checkDuration.Record(ctx, time.Since(start).Seconds(), t.bySource[sourceSlot(res.Source)]...)
	}
	return res, err
}
