package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/quotad/quotad/algorithms"
)

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
	// On a Redis span: units asked for and taken beyond the check's own
	// cost, and units a release gives back.
	attrLeaseWant     = attribute.Key("quotad.lease.want")
	attrLeaseGranted  = attribute.Key("quotad.lease.granted")
	attrLeaseReleased = attribute.Key("quotad.lease.released")
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
	redisDurationBuckets = []float64{1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
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

	// db instruments the store's calls; nil unless the store is Redis and
	// there is a tracer or a meter.
	db *dbTelemetry

	registration metric.Registration
}

// observed reports whether checks are traced or measured at all; when not,
// Check takes the bare path.
func (t *telemetry) observed() bool { return t.tracer != nil || t.checkDuration != nil }

// newTelemetry makes n's instruments and registers the observable ones,
// which read n's counters at each collection.
func newTelemetry(cfg Telemetry, n *Node, store Store) (*telemetry, error) {
	t := &telemetry{}
	if tp := cfg.TracerProvider; tp != nil && !isNoopTracer(tp) {
		t.tracer = tp.Tracer(instrumentationName)
	}
	var meter metric.Meter
	if mp := cfg.MeterProvider; mp != nil && !isNoopMeter(mp) {
		meter = mp.Meter(instrumentationName)
		if err := t.instrument(meter, n); err != nil {
			return nil, err
		}
	}
	if d, ok := store.(dbDescriber); ok && (t.tracer != nil || meter != nil) {
		db, err := newDBTelemetry(t.tracer, meter, d.dbAttributes())
		if err != nil {
			return nil, err
		}
		t.db = db
	}
	return t, nil
}

func isNoopTracer(tp trace.TracerProvider) bool {
	_, noop := tp.(tracenoop.TracerProvider)
	return noop
}

func isNoopMeter(mp metric.MeterProvider) bool {
	_, noop := mp.(metricnoop.MeterProvider)
	return noop
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
		{name: "quotad.lease.units.held", unit: "{unit}", desc: "Units this node's leases hold now.", gauge: true, value: n.unitsHeld},
		{name: "quotad.store.state_losses", unit: "{event}", desc: "Times the store's state changed under the node (a Redis restart, failover or flush) and it dropped its leases and cached denials.", value: n.stats.storeStateLosses.Load},
		{name: "quotad.client_lease.grants", unit: "{grant}", desc: "Leases granted to clients (AcquireLease) to spend in their own processes.", value: n.clients.granted.Load},
		{name: "quotad.client_lease.units.leased", unit: "{unit}", desc: "Units granted in client leases (beyond the granting checks' own cost).", value: n.clients.unitsGranted.Load},
		{name: "quotad.client_lease.units.returned", unit: "{unit}", desc: "Client-leased units given back to the store unused (ReturnLease).", value: n.clients.unitsReturned.Load},
		{name: "quotad.client_lease.outstanding", unit: "{grant}", desc: "Client leases this node remembers now: neither returned nor forgotten after they expired.", gauge: true, value: func() int64 { g, _ := n.clients.unitsHeld(); return int64(g) }},
		{name: "quotad.client_lease.units.held", unit: "{unit}", desc: "Units of the client leases this node remembers now, spent or not.", gauge: true, value: func() int64 { _, u := n.clients.unitsHeld(); return u }},
		{name: "quotad.lease.keys", unit: "{key}", desc: "Keys this node tracks for leasing (remote stores only).", gauge: true, value: n.leases.size.Load},
		{name: "quotad.lease.table_full", unit: "{check}", desc: "Checks of untracked keys that found the lease table full and went to the store without a lease or coalescing.", value: n.leases.full.Load},
		// A state has no unit: unit "1" would make Prometheus call it a
		// ratio (quotad_breaker_state_ratio).
		{name: "quotad.breaker.state", desc: "Redis circuit breaker: 0 closed, 1 half-open, 2 open.", gauge: true, value: breakerState},
		{name: "quotad.cluster.members", unit: "{node}", desc: "Nodes sharing the store, as the node sizes leases by.", gauge: true, value: func() int64 { return int64(n.clusterSize()) }},
	}
	if m, ok := n.store.(*MemoryStore); ok {
		obs = append(obs,
			&observable{name: "quotad.memory_store.keys", unit: "{key}", desc: "States the embedded memory store holds (one per key and algorithm, expired ones until swept); it refuses new keys at quotad.memory_store.max_keys.", gauge: true, value: func() int64 { return int64(m.Len()) }},
			&observable{name: "quotad.memory_store.max_keys", unit: "{key}", desc: "The most states the embedded memory store holds.", gauge: true, value: func() int64 { return int64(m.MaxKeys()) }},
			&observable{name: "quotad.memory_store.refusals", unit: "{check}", desc: "Checks refused with ResourceExhausted because the memory store was full.", value: m.Refused},
		)
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
func (n *Node) checkObserved(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	t := n.tel
	start := time.Now()
	var span trace.Span
	if t.tracer != nil {
		// Attributes are set after Start, and only on a recording span: a
		// span the sampler drops then costs no attribute slices. (quotad's
		// samplers do not look at attributes.)
		ctx, span = t.tracer.Start(ctx, checkSpanName)
	}
	res, err := n.check(ctx, p, key, cost)
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

// policyCounts counts one policy's decisions by [allowed][source slot].
type policyCounts struct {
	policy string
	n      [2][sourceSlots]atomic.Int64
}

func (c *policyCounts) count(res Result) {
	allowed := 0
	if res.Allowed {
		allowed = 1
	}
	c.n[allowed][sourceSlot(res.Source)].Add(1)
}

// observe reports c's nonzero counts. It runs at collection, so building
// the attribute sets here costs checks nothing.
func (c *policyCounts) observe(o metric.Observer, inst metric.Int64Observable) {
	for allowed, outcome := range []string{"denied", "allowed"} {
		for slot := range sourceSlots {
			if v := c.n[allowed][slot].Load(); v > 0 {
				o.ObserveInt64(inst, v, metric.WithAttributeSet(attribute.NewSet(
					attrPolicy.String(c.policy), attrOutcome.String(outcome), attrSource.String(sourceLabel(slot)))))
			}
		}
	}
}

// policyLabels maps policy names to their decision counts. Reads are
// lock-free (an immutable map behind an atomic pointer) because every
// measured check does one; a new name copies the map, which happens at
// most maxPolicyLabels times.
type policyLabels struct {
	m     atomic.Pointer[map[string]*policyCounts]
	mu    sync.Mutex // serializes copies
	other *policyCounts
	// full is set once the map holds maxPolicyLabels names, so that a flood
	// of new names goes to other without taking mu.
	full atomic.Bool
}

// init fills the map with the configured policies.
func (l *policyLabels) init(configured []Policy) {
	m := make(map[string]*policyCounts, len(configured))
	for _, p := range configured {
		m[p.Name] = &policyCounts{policy: p.Name}
	}
	l.m.Store(&m)
	l.other = &policyCounts{policy: otherPolicyLabel}
}

// addConfigured gives policies that a reload configured their own label,
// past maxPolicyLabels if need be: configured policies always have one.
func (l *policyLabels) addConfigured(names []string) {
	if len(names) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.m.Load()
	m := make(map[string]*policyCounts, len(old)+len(names))
	for k, v := range old {
		m[k] = v
	}
	for _, name := range names {
		if _, ok := m[name]; !ok {
			m[name] = &policyCounts{policy: name}
		}
	}
	l.m.Store(&m)
}

func (l *policyLabels) get(policy string) *policyCounts {
	if c, ok := (*l.m.Load())[policy]; ok {
		return c
	}
	if l.full.Load() {
		return l.other
	}
	return l.add(policy)
}

func (l *policyLabels) add(policy string) *policyCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.m.Load()
	if c, ok := old[policy]; ok {
		return c
	}
	if len(old) >= maxPolicyLabels {
		l.full.Store(true)
		return l.other
	}
	m := make(map[string]*policyCounts, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	c := &policyCounts{policy: policy}
	m[policy] = c
	l.m.Store(&m)
	return c
}

// observe reports every policy's counts.
func (l *policyLabels) observe(o metric.Observer, inst metric.Int64Observable) {
	for _, c := range *l.m.Load() {
		c.observe(o, inst)
	}
	l.other.observe(o, inst)
}

// dbDescriber is a store that describes itself with OpenTelemetry's
// database attributes (db.system.name, server.address, ...); only such
// stores get spans and metrics for their calls.
type dbDescriber interface {
	dbAttributes() []attribute.KeyValue
}

// redisOperation is the command every store call is: a Lua script by SHA
// (a NOSCRIPT retry as EVAL is part of the same call).
const redisOperation = "EVALSHA"

// dbTelemetry instruments the calls to a Redis store.
type dbTelemetry struct {
	tracer    trace.Tracer // nil: no spans
	spanAttrs []attribute.KeyValue

	duration metric.Float64Histogram // nil: no metrics
	errors   metric.Int64Counter
	okOpts   []metric.RecordOption
}

func newDBTelemetry(tracer trace.Tracer, meter metric.Meter, attrs []attribute.KeyValue) (*dbTelemetry, error) {
	d := &dbTelemetry{tracer: tracer, spanAttrs: append(attrs[:len(attrs):len(attrs)], semconv.DBOperationName(redisOperation))}
	if meter == nil {
		return d, nil
	}
	var err error
	// db.client.operation.duration is the semantic conventions' instrument;
	// its recommended attributes are the low-cardinality ones.
	if d.duration, err = meter.Float64Histogram("db.client.operation.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of database client operations."),
		metric.WithExplicitBucketBoundaries(redisDurationBuckets...)); err != nil {
		return nil, fmt.Errorf("db.client.operation.duration: %w", err)
	}
	if d.errors, err = meter.Int64Counter("quotad.store.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Failed Redis calls, by error.type.")); err != nil {
		return nil, fmt.Errorf("quotad.store.errors: %w", err)
	}
	d.okOpts = []metric.RecordOption{metric.WithAttributeSet(d.metricAttributes(""))}
	return d, nil
}

func (d *dbTelemetry) metricAttributes(errorType string) attribute.Set {
	kv := []attribute.KeyValue{semconv.DBSystemNameRedis, semconv.DBOperationName(redisOperation)}
	if errorType != "" {
		kv = append(kv, semconv.ErrorTypeKey.String(errorType))
	}
	return attribute.NewSet(kv...)
}

// start begins the span of one store call, if ctx is part of a trace: a
// call no check waits for (the janitor returning expired leases) would
// otherwise be a trace of its own every few hundred milliseconds.
func (d *dbTelemetry) start(ctx context.Context, script string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if d.tracer == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, nil
	}
	all := make([]attribute.KeyValue, 0, len(d.spanAttrs)+1+len(attrs))
	all = append(append(append(all, d.spanAttrs...), semconv.DBStoredProcedureName(script)), attrs...)
	return d.tracer.Start(ctx, redisOperation, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(all...))
}

// end finishes a store call begun at start: its span, if any, and its
// metrics.
func (d *dbTelemetry) end(ctx context.Context, span trace.Span, start time.Time, err error, attrs ...attribute.KeyValue) {
	errorType := ""
	if err != nil {
		errorType = redisErrorType(err)
	}
	if d.duration != nil {
		opts := d.okOpts
		if err != nil {
			set := d.metricAttributes(errorType)
			opts = []metric.RecordOption{metric.WithAttributeSet(set)}
			d.errors.Add(ctx, 1, metric.WithAttributeSet(set))
		}
		d.duration.Record(ctx, time.Since(start).Seconds(), opts...)
	}
	if span == nil {
		return
	}
	if err != nil {
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType))
		span.SetStatus(codes.Error, err.Error())
	} else if len(attrs) > 0 {
		span.SetAttributes(attrs...)
	}
	span.End()
}

// redisErrorType names a failed call's error for error.type, from a small
// set: timeout, canceled, closed, network, the Redis error code (the first
// word of a Redis error reply, e.g. NOSCRIPT, BUSY, READONLY), or _OTHER.
func redisErrorType(err error) string {
	var rerr redis.Error
	var nerr net.Error
	switch {
	case errors.Is(err, ErrStoreUnavailable):
		return "breaker_open"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, redis.ErrClosed):
		return "closed"
	case errors.As(err, &rerr):
		if code := redisErrorCode(rerr.Error()); code != "" {
			return code
		}
	case errors.As(err, &nerr):
		if nerr.Timeout() {
			return "timeout"
		}
		return "network"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// redisErrorCode returns the leading upper-case word of a Redis error
// reply, or "" if it has none; longer words are not codes (and would make
// error.type unbounded).
func redisErrorCode(msg string) string {
	for i := 0; i < len(msg) && i <= 16; i++ {
		c := msg[i]
		if c == ' ' && i > 0 {
			return msg[:i]
		}
		if c < 'A' || c > 'Z' {
			return ""
		}
	}
	if len(msg) > 0 && len(msg) <= 16 {
		return msg
	}
	return ""
}

// acquire is n.store.Acquire, traced and measured when the store is Redis.
func (n *Node) acquire(ctx context.Context, base string, l algorithms.Limit, cost, want int64, hold time.Duration) (algorithms.Decision, algorithms.Grant, error) {
	db := n.tel.db
	if db == nil {
		return n.store.Acquire(ctx, base, l, cost, want, hold)
	}
	var span trace.Span
	if want > cost {
		ctx, span = db.start(ctx, l.Algorithm.String(), attrLeaseWant.Int64(want-cost))
	} else {
		ctx, span = db.start(ctx, l.Algorithm.String())
	}
	start := time.Now()
	d, g, err := n.store.Acquire(ctx, base, l, cost, want, hold)
	var granted []attribute.KeyValue
	if span != nil && want > cost {
		granted = []attribute.KeyValue{attrLeaseGranted.Int64(max(0, g.Units-cost))}
	}
	db.end(ctx, span, start, err, granted...)
	return d, g, err
}

// releaseUnits is n.store.Release, traced and measured when the store is
// Redis.
func (n *Node) releaseUnits(ctx context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	db := n.tel.db
	if db == nil {
		return n.store.Release(ctx, base, l, units, g)
	}
	ctx, span := db.start(ctx, "release_"+l.Algorithm.String(), attrLeaseReleased.Int64(units))
	start := time.Now()
	returned, err := n.store.Release(ctx, base, l, units, g)
	db.end(ctx, span, start, err)
	return returned, err
}
