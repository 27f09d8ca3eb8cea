package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc"
)

// configPollInterval is how often the --config file is read to see whether
// it changed. Kubernetes updates a mounted ConfigMap by swapping a symlink
// (..data) to a new directory, which no watch on the file itself sees, so
// the file is read through its path and its content compared.
const configPollInterval = time.Second

// reloader applies a new configuration while quotad serves: on SIGHUP, and
// when the --config file's content changes. It builds the whole new
// configuration as startup does (loadConfig: defaults, file, environment,
// flags, validation) and then applies, in one step each, what can change
// without a restart: the policies (node.SetPolicies), Envoy's rules
// (rpc.Handler.SetRules) and the log level. A configuration that does not
// load is not applied at all. Settings that need a restart are reported
// and keep their running values.
type reloader struct {
	args   []string
	getenv func(string) string
	log    *slog.Logger
	level  *slog.LevelVar
	node   *node.Node
	api    *rpc.Handler
	meters reloadMeters

	mu sync.Mutex // serializes reloads; guards the fields below
	// cur is the configuration in force.
	cur config
	// generation counts the configurations applied (1 at start); atomic, so
	// that /metrics never waits for a reload.
	generation atomic.Int64
	// seen is the file content last tried, applied or not (its SHA-256, or
	// the read error), so that a refused file is reported once, not at
	// every poll.
	seen string
}

// newReloader returns the reloader of a quotad started with cfg, which
// loadConfig made from args and getenv. meter may be nil (no metrics).
func newReloader(cfg config, args []string, getenv func(string) string, log *slog.Logger, level *slog.LevelVar, n *node.Node, api *rpc.Handler, meter metric.MeterProvider) (*reloader, error) {
	r := &reloader{args: args, getenv: getenv, log: log, level: level, node: n, api: api, cur: cfg, seen: cfg.File.SHA256}
	r.generation.Store(1)
	if err := r.meters.init(meter, r); err != nil {
		return nil, err
	}
	return r, nil
}

// start runs r until ctx ends or stop is called, whichever comes first;
// stop waits for a reload in progress and may be called more than once.
// While r runs, SIGHUP reloads; before and after, SIGHUP is ignored (main
// ignores it from the start), so it never ends the process.
func (r *reloader) start(ctx context.Context) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx, hup)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			signal.Stop(hup)
			signal.Ignore(syscall.SIGHUP)
		})
	}
}

// run reloads on each value from hup and whenever the file's content
// changes, until ctx ends.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	t := time.NewTicker(configPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload(ctx, "SIGHUP")
		case <-t.C:
			if r.cur.File.Path != "" && r.fileContent() != r.seenContent() {
				r.reload(ctx, "file changed")
			}
		}
	}
}

func (r *reloader) seenContent() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen
}

// fileContent identifies what the config file holds now: the SHA-256 of
// its bytes, or why it cannot be read.
func (r *reloader) fileContent() string {
	raw, err := os.ReadFile(r.cur.File.Path)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// reload loads the configuration anew and applies it, or keeps the running
// one if it does not load. trigger says why, for the log.
func (r *reloader) reload(ctx context.Context, trigger string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur.File.Path != "" {
		r.seen = r.fileContent()
	}
	next, err := loadConfig(r.args, r.getenv, io.Discard)
	if err != nil {
		r.refuse(ctx, trigger, err)
		return
	}
	if next.File.SHA256 != "" {
		r.seen = next.File.SHA256
	}
	apply, restart := reloadable(r.cur, next)
	if len(restart) > 0 {
		r.log.Warn("config: settings that change only with a restart keep their running values",
			"file", next.File.Path, "settings", strings.Join(restart, ", "))
	}
	changes, err := r.node.SetPolicies(ctx, apply.Policies)
	if err != nil {
		r.refuse(ctx, trigger, fmt.Errorf("policies: %w", err))
		return
	}
	generation := r.generation.Load() + 1
	v := rpc.ConfigVersion{Generation: generation, Hash: apply.File.SHA256, LoadedAt: time.Now()}
	if err := r.api.SetRules(rpc.Rules{Envoy: apply.Envoy, Policies: apply.Policies, Version: v}); err != nil {
		// loadConfig compiled the same rules against the same policies, so
		// this does not happen; if it did, the policies go back too, so
		// that nothing is half applied.
		if _, backErr := r.node.SetPolicies(ctx, r.cur.Policies); backErr != nil {
			err = errors.Join(err, backErr)
		}
		r.refuse(ctx, trigger, fmt.Errorf("envoy: %w", err))
		return
	}
	if level, err := parseLogLevel(apply.LogLevel); err == nil {
		r.level.Set(level)
	}
	r.cur = apply
	r.generation.Store(generation)
	r.meters.count(ctx, "success")
	r.log.Info("config reloaded", "trigger", trigger, "file", apply.File.Path, "sha256", apply.File.SHA256,
		"generation", generation, "policies", len(apply.Policies), "added", changes.Added, "removed", changes.Removed,
		"changed", changes.Changed, "envoy_domains", len(apply.Envoy.Domains), "log_level", apply.LogLevel)
}

// refuse reports a configuration that was not applied.
func (r *reloader) refuse(ctx context.Context, trigger string, err error) {
	r.meters.count(ctx, "failure")
	attrs := []any{"trigger", trigger}
	var fe *fileError
	if errors.As(err, &fe) {
		attrs = append(attrs, "file", fe.Path, "line", fe.Line, "field", fe.Field)
	} else {
		attrs = append(attrs, "file", r.cur.File.Path)
	}
	attrs = append(attrs, "err", err, "generation", r.generation.Load())
	r.log.Error("config reload failed; the running config stays in force", attrs...)
}

// reloadable splits next into what can be applied while serving, and the
// settings that would need a restart: it returns next with those settings
// set back to cur's values, and their names as the file spells them.
// The policies, Envoy's rules and the log level are applied; everything
// else (listen address, Redis, cluster, telemetry, leases, ...) needs a
// restart, and so does starting or stopping to serve Envoy's rate limit
// service. A setting added to config later needs a restart unless it is
// added here.
func reloadable(cur, next config) (config, []string) {
	var restart []string
	apply := next
	a, c := reflect.ValueOf(&apply).Elem(), reflect.ValueOf(cur)
	for i := range a.NumField() {
		name := a.Type().Field(i).Name
		switch name {
		case "Policies", "LogLevel", "File":
			continue
		case "Envoy":
			if (len(cur.Envoy.Domains) > 0) != (len(next.Envoy.Domains) > 0) {
				restart = append(restart, "envoy (starting or stopping Envoy's rate limit service)")
				apply.Envoy = cur.Envoy
			}
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), c.Field(i).Interface()) {
			restart = append(restart, fileKey(name))
			a.Field(i).Set(c.Field(i))
		}
	}
	return apply, restart
}

// fileKey names config's field as the config file does: KeyPrefix →
// key_prefix.
func fileKey(field string) string {
	if field == "Telemetry" {
		return "tracing, metrics"
	}
	var b strings.Builder
	for i, r := range field {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// reloadMeters are the reload's metrics: quotad_config_reloads_total by
// result (success, failure) and quotad_config_generation. Without a meter
// they count nothing.
type reloadMeters struct {
	reloads metric.Int64Counter
	results map[string]metric.AddOption
}

func (m *reloadMeters) init(mp metric.MeterProvider, r *reloader) error {
	if mp == nil {
		return nil
	}
	meter := mp.Meter("github.com/quotad/quotad/cmd/quotad")
	var err error
	if m.reloads, err = meter.Int64Counter("quotad.config.reloads", metric.WithUnit("{reload}"),
		metric.WithDescription("Configuration reloads (SIGHUP or a changed --config file), by result: success or failure (the running config stays).")); err != nil {
		return fmt.Errorf("quotad.config.reloads: %w", err)
	}
	m.results = map[string]metric.AddOption{}
	for _, result := range []string{"success", "failure"} {
		m.results[result] = metric.WithAttributeSet(attribute.NewSet(attribute.String("result", result)))
		// Both series exist from the start, so that an alert on their
		// increase sees the first one.
		m.reloads.Add(context.Background(), 0, m.results[result])
	}
	_, err = meter.Int64ObservableGauge("quotad.config.generation",
		metric.WithDescription("Configurations applied since the process started: 1 at start, +1 per reload applied."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(r.generation.Load())
			return nil
		}))
	if err != nil {
		return fmt.Errorf("quotad.config.generation: %w", err)
	}
	return nil
}

func (m *reloadMeters) count(ctx context.Context, result string) {
	if m.reloads != nil {
		m.reloads.Add(ctx, 1, m.results[result])
	}
}
