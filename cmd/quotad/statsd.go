package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/quotad/quotad/rpc/envoy"
)

// This file sends envoyproxy/ratelimit's statistics to statsd
// (--statsd-addr): every flush interval, the counts of quotad's Envoy
// counters since the last flush, under that project's names
// (envoy.UpstreamStatName), as statsd counter lines (name:count|c), in
// datagrams of at most statsdMaxDatagram bytes over UDP or as a stream
// over TCP, as lyft/gostats sends them.

// Statsd protocols (--statsd-protocol).
const (
	statsdUDP = "udp"
	statsdTCP = "tcp"
)

// statsdMaxDatagram is the most bytes of one UDP datagram: what fits an
// Ethernet frame of 1500 bytes without fragments, as lyft/gostats and
// datadog-go send.
const statsdMaxDatagram = 1432

// statsdDialTimeout bounds opening a TCP connection to statsd, and
// statsdWriteTimeout one flush's write on it: a statsd that does not
// answer costs that flush's counts, never a check.
const (
	statsdDialTimeout  = 1500 * time.Millisecond
	statsdWriteTimeout = time.Second
)

// statsdConfig says where envoyproxy/ratelimit's statistics go. The zero
// value sends none.
type statsdConfig struct {
	// Addr is the statsd server, host:port. Empty sends nothing.
	Addr string
	// Protocol is udp or tcp. Default udp.
	Protocol string
	// FlushInterval is how often the counts are sent. Default 10s, as
	// envoyproxy/ratelimit's STATS_FLUSH_INTERVAL.
	FlushInterval time.Duration
	// Tags are added to every statistic, "key:value,key:value": in the
	// name (name.__key=value, keys sorted) as lyft/gostats writes them, or
	// as DogStatsD tags with DogStatsD.
	Tags string
	// DogStatsD writes Tags as DogStatsD tags (name:1|c|#key:value).
	DogStatsD bool
	// Mogrifiers rewrite the names sent to DogStatsD and add tags, as
	// envoyproxy/ratelimit's USE_DOG_STATSD_MOGRIFIERS: a JSON array of
	// statsdMogrifierSpec (statsd_mogrifiers.go), the first that matches
	// a name applied. Needs DogStatsD. Empty rewrites nothing.
	Mogrifiers string
}

// validate reports the first problem, naming the flag to fix.
func (c statsdConfig) validate() error {
	if c.Addr == "" {
		switch {
		case c.Tags != "":
			return errors.New("statsd tags: --statsd-tags needs --statsd-addr (where to send the statistics)")
		case c.DogStatsD:
			return errors.New("statsd dogstatsd: --statsd-dogstatsd needs --statsd-addr (where to send the statistics)")
		case c.Mogrifiers != "":
			return errors.New("statsd mogrifiers: --statsd-mogrifiers needs --statsd-addr (where to send the statistics)")
		}
		return nil
	}
	if c.Mogrifiers != "" && !c.DogStatsD {
		return errors.New("statsd mogrifiers: --statsd-mogrifiers rewrites DogStatsD names; it needs --statsd-dogstatsd")
	}
	if _, err := parseStatsdMogrifiers(c.Mogrifiers); err != nil {
		return fmt.Errorf("statsd mogrifiers: %w", err)
	}
	if _, port, err := net.SplitHostPort(c.Addr); err != nil || port == "" {
		return fmt.Errorf("statsd addr: %q: want host:port, e.g. localhost:8125", c.Addr)
	}
	switch c.Protocol {
	case statsdUDP, statsdTCP:
	default:
		return fmt.Errorf("statsd protocol: %q: want udp or tcp", c.Protocol)
	}
	if c.FlushInterval <= 0 {
		return fmt.Errorf("statsd flush interval: %s must be > 0", c.FlushInterval)
	}
	if _, err := parseStatsdTags(c.Tags); err != nil {
		return fmt.Errorf("statsd tags: %w", err)
	}
	return nil
}

// statsdTag is one of --statsd-tags.
type statsdTag struct{ key, value string }

// parseStatsdTags reads "key:value,key:value", sorted by key.
func parseStatsdTags(s string) ([]statsdTag, error) {
	if s == "" {
		return nil, nil
	}
	var tags []statsdTag
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), ":")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%q: want key:value,key:value", s)
		}
		tags = append(tags, statsdTag{k, v})
	}
	slices.SortFunc(tags, func(a, b statsdTag) int { return strings.Compare(a.key, b.key) })
	return tags, nil
}

// statsdTagValueChars are what lyft/gostats writes '_' in a tag's value,
// which would otherwise end the name or the level.
var statsdTagValueChars = strings.NewReplacer(".", "_", ":", "_", "|", "_")

// statsdExporter is the sdkmetric.Exporter that sends quotad's Envoy
// counters to statsd. Only counters are aggregated for it, as deltas.
type statsdExporter struct {
	network, addr string
	// nameSuffix follows every name (".__key=value..." for tags in the
	// name); dogTags are DogStatsD's (key:value), written after the
	// count (|#key:value,...), before any a mogrifier adds.
	nameSuffix string
	dog        bool
	dogTags    []string
	mogrifiers []statsdMogrifier
	log        *slog.Logger

	mu     sync.Mutex
	conn   net.Conn // nil until dialed, and after a failed write
	failed bool     // the last flush failed: said once, until one succeeds
}

// newStatsdExporter returns the exporter for cfg (validated).
func newStatsdExporter(cfg statsdConfig, log *slog.Logger) *statsdExporter {
	e := &statsdExporter{network: cfg.Protocol, addr: cfg.Addr, dog: cfg.DogStatsD, log: log}
	tags, _ := parseStatsdTags(cfg.Tags) // validated
	e.mogrifiers, _ = parseStatsdMogrifiers(cfg.Mogrifiers)
	var b strings.Builder
	for _, t := range tags {
		if cfg.DogStatsD {
			e.dogTags = append(e.dogTags, t.key+":"+t.value)
			continue
		}
		b.WriteString(".__" + t.key + "=" + statsdTagValueChars.Replace(t.value))
	}
	e.nameSuffix = b.String()
	return e
}

// statsdReader is the periodic reader that flushes e every interval.
func statsdReader(e *statsdExporter, interval time.Duration) *sdkmetric.PeriodicReader {
	return sdkmetric.NewPeriodicReader(e, sdkmetric.WithInterval(interval), sdkmetric.WithTimeout(statsdDialTimeout+statsdWriteTimeout))
}

// Temporality is delta: each flush sends the counts since the last.
func (e *statsdExporter) Temporality(sdkmetric.InstrumentKind) metricdata.Temporality {
	return metricdata.DeltaTemporality
}

// Aggregation sums counters and drops every other instrument, which
// statsd is not sent: a check pays for no histogram twice.
func (e *statsdExporter) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	if k == sdkmetric.InstrumentKindCounter {
		return sdkmetric.DefaultAggregationSelector(k)
	}
	return sdkmetric.AggregationDrop{}
}

// Export sends the counts of rm that have an envoyproxy/ratelimit name.
// A statsd that cannot be reached costs this flush's counts, said once
// until a flush succeeds again; the error is not returned, which would
// be logged at every flush.
func (e *statsdExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	lines := e.lines(rm)
	if len(lines) == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	err := e.send(ctx, lines)
	switch {
	case err != nil && !e.failed:
		e.log.Warn("statsd: statistics not sent; dropped until it answers", "addr", e.addr, "protocol", e.network, "err", err)
	case err == nil && e.failed:
		e.log.Info("statsd: sending statistics again", "addr", e.addr)
	}
	e.failed = err != nil
	return nil
}

// lines are rm's counts as statsd lines, without their newlines.
func (e *statsdExporter) lines(rm *metricdata.ResourceMetrics) []string {
	var lines []string
	add := func(name string, n int64) {
		if n <= 0 {
			return
		}
		if !e.dog {
			lines = append(lines, fmt.Sprintf("%s%s:%d|c", name, e.nameSuffix, n))
			return
		}
		name, added := mogrify(e.mogrifiers, name)
		line := fmt.Sprintf("%s:%d|c", name, n)
		if tags := append(slices.Clip(e.dogTags), added...); len(tags) > 0 {
			line += "|#" + strings.Join(tags, ",")
		}
		lines = append(lines, line)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			for _, p := range sum.DataPoints {
				if name, ok := statsdName(m.Name, p.Attributes); ok {
					add(name, p.Value)
				}
			}
		}
	}
	return lines
}

// statsdName is envoyproxy/ratelimit's name of a point of the counter
// instrument: the Envoy statistics (envoy.UpstreamStatName) and the
// reloads of the configuration, ratelimit.service.config_load_success and
// config_load_error.
func statsdName(instrument string, attrs attribute.Set) (string, bool) {
	if instrument == "quotad.config.reloads" {
		switch v, _ := attrs.Value("result"); v.AsString() {
		case "success":
			return "ratelimit.service.config_load_success", true
		case "failure":
			return "ratelimit.service.config_load_error", true
		}
		return "", false
	}
	return envoy.UpstreamStatName(instrument, attrs)
}

// send writes lines: over UDP in datagrams of at most statsdMaxDatagram
// bytes (a longer line alone in its own), over TCP as one stream. e.mu
// is held.
func (e *statsdExporter) send(ctx context.Context, lines []string) error {
	if e.conn == nil {
		d := net.Dialer{Timeout: statsdDialTimeout}
		conn, err := d.DialContext(ctx, e.network, e.addr)
		if err != nil {
			return err
		}
		e.conn = conn
	}
	var chunks [][]byte
	if e.network == statsdUDP {
		chunks = statsdDatagrams(lines, statsdMaxDatagram)
	} else {
		chunks = [][]byte{[]byte(strings.Join(lines, "\n") + "\n")}
	}
	_ = e.conn.SetWriteDeadline(time.Now().Add(statsdWriteTimeout))
	for _, c := range chunks {
		if _, err := e.conn.Write(c); err != nil {
			// A TCP statsd that went away is dialed again at the next
			// flush; a UDP one that refused a datagram (ICMP) may be
			// back then too.
			e.conn.Close()
			e.conn = nil
			return err
		}
	}
	return nil
}

// statsdDatagrams packs lines, each ended by a newline, into datagrams of
// at most limit bytes; a line longer than limit goes alone.
func statsdDatagrams(lines []string, limit int) [][]byte {
	var out [][]byte
	var cur []byte
	for _, l := range lines {
		if len(cur) > 0 && len(cur)+len(l)+1 > limit {
			out = append(out, cur)
			cur = nil
		}
		cur = append(cur, l...)
		cur = append(cur, '\n')
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// ForceFlush has nothing to do: Export writes before it returns.
func (e *statsdExporter) ForceFlush(context.Context) error { return nil }

// Shutdown closes the connection, after the reader's last Export.
func (e *statsdExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn != nil {
		e.conn.Close()
		e.conn = nil
	}
	return nil
}

// describe is the startup line's part about statsd.
func (c statsdConfig) describe() string {
	if c.Addr == "" {
		return ""
	}
	format := "statsd"
	if c.DogStatsD {
		format = "DogStatsD"
	}
	return fmt.Sprintf(", %s: %s %s every %s", format, c.Protocol, c.Addr, c.FlushInterval)
}
