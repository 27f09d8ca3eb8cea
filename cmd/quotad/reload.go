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
	"github.com/quotad/quotad/rpc/envoy"
)

// configPollInterval is how often the --config file and the
// --envoy-config-dir directory are read to see whether they changed.
// Kubernetes updates a mounted ConfigMap by swapping a symlink (..data) to
// a new directory, which no watch on the file itself sees, so the files are
// read through their paths and their contents compared.
const configPollInterval = time.Second

// reloader applies a new configuration while quotad serves: on SIGHUP, and
// when the content of the --config file or of the --envoy-config-dir
// directory's config files changes. It is the one place that does: it
// builds the whole new configuration as startup does (loadConfig:
// defaults, file, environment, flags, validation; then the directory's
// files, compiled with the new policies by config.envoyRules) and then
// applies, in one goroutine and one step each, what can change without a
// restart: the policies (node.SetPolicies), Envoy's rules (one
// envoy.Switch swap, through rpc.Handler.SetRules) and the log level. A
// configuration that does not load, file or directory, is not applied at
// all. Settings that need a restart are reported and keep their running
// values.
type reloader struct {
	args   []string
	getenv func(string) string
	log    *slog.Logger
	level  *slog.LevelVar
	meters reloadMeters
	// every is how often the sources are polled; configPollInterval.
	every time.Duration
	// node and api are what reloads apply to; start sets them.
	node *node.Node
	api  *rpc.Handler

	// mu guards the fields below. Reloads run one at a time, on run's
	// goroutine.
	mu sync.Mutex
	// cur is the configuration in force.
	cur config
	// version is the configuration in force's: its generation (1 at start),
	// content hash and load time; atomic, so that /metrics and /status
	// never wait for a reload.
	version atomic.Pointer[rpc.ConfigVersion]
	// seen is the content last tried, applied or not (contentHash, or why
	// a source could not be read), so that a refused configuration is
	// reported once, not at every poll.
	seen string
	// xds holds the rules files an xDS management server sent last
	// (envoy_xds.go); nil without --envoy-xds-server.
	xds *xdsFiles
}

// newReloader returns the reloader of a quotad started with cfg, which
// loadConfig made from args and getenv, and the files of its
// --envoy-config-dir (loadEnvoy). meter may be nil (no metrics).
func newReloader(cfg config, envoyFiles []envoyFile, args []string, getenv func(string) string, log *slog.Logger, level *slog.LevelVar, meter metric.MeterProvider) (*reloader, error) {
	hash := contentHash(cfg, envoyFiles)
	r := &reloader{args: args, getenv: getenv, log: log, level: level, every: configPollInterval, cur: cfg, seen: hash}
	if cfg.EnvoyXDS.Server != "" {
		r.xds = &xdsFiles{}
	}
	r.version.Store(&rpc.ConfigVersion{Generation: 1, Hash: hash, LoadedAt: time.Now()})
	if err := r.meters.init(meter, r); err != nil {
		return nil, err
	}
	return r, nil
}

// configVersion is the version of the configuration in force, for GET
// /cluster.
func (r *reloader) configVersion() rpc.ConfigVersion { return *r.version.Load() }

// configGeneration is the generation of the configuration in force and
// when it was loaded, for GET /status (rpc.Config.ConfigGeneration).
func (r *reloader) configGeneration() (uint64, time.Time) {
	v := r.version.Load()
	return uint64(v.Generation), v.LoadedAt
}

// start runs r, applying reloads to node n and its API api, until ctx ends
// or stop is called, whichever comes first; stop may be called more than
// once. stop waits for a reload being applied (a few swaps), never for
// one reading or compiling the configuration, which it leaves behind
// (reload). While r runs, SIGHUP
// reloads; before and after, SIGHUP is ignored (main ignores it from the
// start), so it never ends the process.
func (r *reloader) start(ctx context.Context, n *node.Node, api *rpc.Handler) (stop func()) {
	r.node, r.api = n, api
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx, hup)
	}()
	var xds sync.WaitGroup
	r.startXDS(ctx, &xds)
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			xds.Wait()
			signal.Stop(hup)
			signal.Ignore(syscall.SIGHUP)
		})
	}
}

// run reloads on each value from hup and whenever the content of the
// config file or of the envoy config dir changes, until ctx ends.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload(ctx, "SIGHUP")
		case <-t.C:
			if !r.polled() {
				continue
			}
			// Reading the sources may take up to fileReadTimeout (a file
			// system that does not answer): shutdown does not wait for it.
			if now, ok := unlessDone(ctx, r.content); ok && now != r.seenContent() {
				r.reload(ctx, "file changed")
			}
		}
	}
}

// polled reports whether the configuration in force has sources to poll:
// a config file, or an envoy config dir.
func (r *reloader) polled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur.File.Path != "" || r.cur.EnvoyDir != ""
}

func (r *reloader) seenContent() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen
}

// content identifies what the sources of the configuration in force hold
// now (contentOf).
func (r *reloader) content() string {
	r.mu.Lock()
	c := r.cur
	r.mu.Unlock()
	return contentOf(c)
}

// contentOf identifies what the sources of configuration c, its config
// file and its envoy config dir, hold now: their contentHash, or why one
// cannot be read.
func contentOf(c config) string {
	if c.File.Path != "" {
		raw, err := readFile(c.File.Path)
		if err != nil {
			return "unreadable: " + err.Error()
		}
		sum := sha256.Sum256(raw)
		c.File.SHA256 = hex.EncodeToString(sum[:])
	}
	var files []envoyFile
	if c.EnvoyDir != "" {
		var err error
		if files, err = readEnvoyFiles(c.EnvoyDir); err != nil {
			return "unreadable: " + err.Error()
		}
	}
	return contentHash(c, files)
}

// contentHash identifies the sources of configuration c: the SHA-256 of
// its config file (hex, as sha256sum prints it; "" without one) when that
// is all; with an envoy config dir, the hex SHA-256 of that and of the
// names and contents of files, the directory's config files.
func contentHash(c config, files []envoyFile) string {
	if c.EnvoyDir == "" {
		return c.File.SHA256
	}
	dir := envoyFilesHash(files)
	h := sha256.New()
	h.Write([]byte(c.File.SHA256))
	h.Write([]byte{0})
	h.Write(dir[:])
	return hex.EncodeToString(h.Sum(nil))
}

// reloadLoad is a configuration a reload built, ready to apply, or why
// it cannot be.
type reloadLoad struct {
	// seen is what the sources in force held when the load began
	// (contentOf), so that polls do not try the same content again.
	seen string
	// err is why the configuration does not load; the rest is then unset.
	err error
	// next is the configuration loaded; apply, what of it applies while
	// serving (reloadable); restart, the settings that would need a
	// restart.
	next, apply config
	restart     []string
	// files are the envoy config dir's files, hash the content of all
	// sources, rules Envoy's rules compiled with the new policies.
	files []envoyFile
	hash  string
	rules *envoy.Rules
	// xdsVersion is the version of the xDS resources among files.
	xdsVersion string
}

// load builds the configuration anew, the config file and the envoy
// config dir alike, as it would apply on top of cur. It reads files and
// computes, and changes nothing: a load that shutdown leaves behind may
// run to its end unseen.
func (r *reloader) load(cur config) reloadLoad {
	l := reloadLoad{seen: contentOf(cur)}
	l.next, l.err = loadConfig(r.args, r.getenv, io.Discard)
	if l.err != nil {
		return l
	}
	l.apply, l.restart = reloadable(cur, l.next)
	if l.apply.EnvoyDir != "" {
		if l.files, l.err = readEnvoyFiles(l.apply.EnvoyDir); l.err != nil {
			l.err = fmt.Errorf("envoy config dir: %w", l.err)
			return l
		}
	}
	l.xdsVersion, l.files = r.xdsCurrent(l.files)
	l.hash = contentHash(l.apply, l.files)
	// The rules are compiled with the new policies before anything is
	// applied: a file that does not compile changes nothing.
	l.rules, l.err = l.apply.envoyRules(l.files)
	return l
}

// reload loads the configuration anew (load) and applies it, or keeps the
// running one if it does not load. trigger says why, for the log. The
// load runs on a goroutine of its own: when ctx ends first (shutdown),
// reload returns at once, and the load, still reading or compiling, is
// left behind and never applied. Only applying, a few swaps, holds
// shutdown up.
func (r *reloader) reload(ctx context.Context, trigger string) {
	r.mu.Lock()
	cur := r.cur
	r.mu.Unlock()
	l, ok := unlessDone(ctx, func() reloadLoad { return r.load(cur) })
	if !ok || ctx.Err() != nil {
		r.log.Info("config reload abandoned: shutting down", "trigger", trigger)
		return
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = l.seen
	if l.err != nil {
		r.refuse(ctx, trigger, l.err)
		return
	}
	apply, files, hash, rules := l.apply, l.files, l.hash, l.rules
	if version, now := r.xds.current(); r.xds != nil && version != l.xdsVersion {
		// The management server's rules changed while this load ran:
		// compile the new policies with them instead.
		files = now
		var err error
		if rules, err = apply.envoyRules(files); err != nil {
			r.refuse(ctx, trigger, err)
			return
		}
	}
	if r.xds != nil {
		hash = xdsHash(apply, files)
	}
	if len(l.restart) > 0 {
		r.log.Warn("config: settings that change only with a restart keep their running values",
			"file", l.next.File.Path, "settings", strings.Join(l.restart, ", "))
	}
	changes, err := r.node.SetPolicies(ctx, apply.Policies)
	if err != nil {
		r.refuse(ctx, trigger, fmt.Errorf("policies: %w", err))
		return
	}
	v := rpc.ConfigVersion{Generation: r.version.Load().Generation + 1, Hash: hash, LoadedAt: time.Now()}
	if err := r.api.SetRules(rpc.Rules{Envoy: rules, Version: v}); err != nil {
		// reloadable keeps Envoy's rate limit service served or unserved
		// as it started, so this does not happen; if it did, the policies
		// go back too, so that nothing is half applied.
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
	r.seen = hash
	r.version.Store(&v)
	r.meters.count(ctx, "success")
	var domains []string
	if rules != nil {
		domains = rules.Domains()
	}
	r.log.Info("config reloaded", "trigger", trigger, "file", apply.File.Path, "sha256", apply.File.SHA256,
		"envoy_config_dir", apply.EnvoyDir, "envoy_files", len(files), "hash", hash,
		"generation", v.Generation, "policies", len(apply.Policies), "added", changes.Added, "removed", changes.Removed,
		"changed", changes.Changed, "envoy_domains", domains, "log_level", apply.LogLevel)
}

// unlessDone runs f on a goroutine of its own and returns what it returns
// and true, or, as soon as ctx ends if that comes first, false: f then
// runs to its end unseen, so it must change nothing that outlives it.
func unlessDone[T any](ctx context.Context, f func() T) (T, bool) {
	done := make(chan T, 1) // f never waits to hand its result over
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v, true
	case <-ctx.Done():
		var zero T
		return zero, false
	}
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
	attrs = append(attrs, "err", err, "generation", r.version.Load().Generation)
	r.log.Error("config reload failed; the running config stays in force", attrs...)
}

// reloadable splits next into what can be applied while serving, and the
// settings that would need a restart: it returns next with those settings
// set back to cur's values, and their names as the file spells them.
// The policies, Envoy's rules (the envoy section, the envoy config dir and
// its files) and the log level are applied; everything else (listen
// address, Redis, cluster, telemetry, leases, console, TLS, admin token,
// ...) needs a restart, and so does starting or stopping to serve Envoy's
// rate limit service. A setting added to config later needs a restart
// unless it is added here.
func reloadable(cur, next config) (config, []string) {
	var restart []string
	apply := next
	a, c := reflect.ValueOf(&apply).Elem(), reflect.ValueOf(cur)
	for i := range a.NumField() {
		name := a.Type().Field(i).Name
		switch name {
		case "Policies", "LogLevel", "File":
			continue
		case "Envoy", "EnvoyDir":
			if name == "Envoy" && servesEnvoy(cur) != servesEnvoy(next) {
				restart = append(restart, "envoy (starting or stopping Envoy's rate limit service)")
				apply.Envoy, apply.EnvoyDir = cur.Envoy, cur.EnvoyDir
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

// servesEnvoy reports whether configuration c serves Envoy's rate limit
// service: it configures a domain or an envoy config dir
// (config.envoyRules returns rules).
func servesEnvoy(c config) bool {
	return len(c.Envoy.Domains) > 0 || c.EnvoyDir != "" || c.EnvoyXDS.Server != ""
}

// fileKey names config's field as the config file does: KeyPrefix →
// key_prefix.
func fileKey(field string) string {
	switch field {
	case "Telemetry":
		return "tracing, metrics"
	case "TLS":
		return "tls"
	case "RLQS":
		return "rlqs"
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
		metric.WithDescription("Configuration reloads (SIGHUP, or a changed --config file or --envoy-config-dir file), by result: success or failure (the running config stays).")); err != nil {
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
			o.Observe(r.version.Load().Generation)
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
