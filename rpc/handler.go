package rpc

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
	"github.com/quotad/quotad/rpc/console"
)

// NewHandler returns the API of node n as one http.Handler:
//
//   - quotad.v1.QuotaService over Connect, gRPC, gRPC-Web and Connect's
//     HTTP/JSON (POST /quotad.v1.QuotaService/Check with
//     Content-Type: application/json);
//   - envoy.service.ratelimit.v3.RateLimitService, Envoy's rate limit
//     service, when cfg.EnvoyRules is set or cfg.Envoy configures domains
//     or is DropIn;
//   - gRPC server reflection, v1 and v1alpha (for grpcurl and buf curl);
//   - gRPC health (grpc.health.v1.Health) for "" and
//     quotad.v1.QuotaService, and GET /readyz: readiness (see Health);
//   - GET /healthz, liveness: 200 "ok\n".
//   - GET /cluster, the node's view of its cluster and its lease and
//     denied-cache figures, as JSON;
//   - GET /status, the node's live figures as JSON: decisions per policy
//     by outcome and source, store calls, breaker, cluster members, config
//     generation and the keys denied most;
//   - unless cfg.DisableConsole, the web console: GET / and its assets
//     under GET /console/ (package console).
//
// gRPC needs HTTP/2: serve the handler with an http.Server whose Protocols
// enable HTTP/1 and unencrypted HTTP/2 (h2c), or over TLS. cfg is defaulted
// and validated; log may be nil (discard). The handler is safe for
// concurrent use; SetRules changes the Envoy rules it serves by.
func NewHandler(n *node.Node, cfg Config, log *slog.Logger) (*Handler, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if n == nil {
		return nil, fmt.Errorf("%w: no node", ErrInvalidConfig)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := cfg.Health
	if h == nil {
		h = NewHealth(n)
	}
	common := connect.WithHandlerOptions(
		// Interceptors run in the order given, so recovery wraps
		// everything after it.
		recoverPanic(log),
		jsonCodecs(),
	)
	// Only the calls that carry many checks may be as large as
	// MaxRequestBytes; every other is bounded far tighter.
	batchLimits := messageLimits(cfg.MaxRequestBytes)
	callLimits := messageLimits(min(cfg.MaxRequestBytes, MaxCallRequestBytes))
	// Telemetry's interceptors go first, around errorInterceptor, so that
	// spans and metrics see the codes clients get.
	interceptors, err := cfg.Telemetry.interceptors()
	if err != nil {
		return nil, err
	}
	svc := &service{
		node:     n,
		policies: policyResolver{inlineAllowed: !cfg.DisableInlineLimits, maxInlinePeriod: cfg.MaxInlinePeriod},
		maxBatch: cfg.MaxBatch,
		log:      log,
		tracer:   cfg.Telemetry.tracer(),
	}
	mux := http.NewServeMux()
	interceptors = append(interceptors, errorInterceptor(log))
	if cfg.AdminToken != "" {
		// Inside errorInterceptor, which gives its refusals their codes.
		interceptors = append(interceptors, adminInterceptor(cfg.AdminToken, log))
	}
	rpcInterceptors := connect.WithInterceptors(interceptors...)
	mux.Handle(quotadv1connect.NewQuotaServiceHandler(svc, common, callLimits, rpcInterceptors))
	// The service once more, under the batch bound, for CheckBatch alone:
	// the mux prefers the exact path to the service's prefix.
	_, batches := quotadv1connect.NewQuotaServiceHandler(svc, common, batchLimits, rpcInterceptors)
	mux.Handle(quotadv1connect.QuotaServiceCheckBatchProcedure, batches)
	rls, envoyServices, err := mountRLS(mux, n, cfg, common, batchLimits, rpcInterceptors)
	if err != nil {
		return nil, err
	}
	handler := &Handler{rls: rls}
	handler.version.Store(&cfg.ConfigVersion)
	reflector := grpcreflect.NewStaticReflector(append([]string{quotadv1connect.QuotaServiceName, grpchealth.HealthV1ServiceName}, envoyServices...)...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, common, callLimits))
	// Many tools (grpcurl among them) still ask v1alpha first.
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, common, callLimits))
	mux.Handle(grpchealth.NewHandler(h, common, callLimits))
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.HandleFunc("GET /cluster", clusterPage(n, handler))
	mux.HandleFunc("GET /status", statusPage(n, cfg, time.Now()))
	if !cfg.DisableConsole {
		c := console.Handler()
		mux.Handle("GET /{$}", c)
		mux.Handle("GET /console/", c)
	}
	handler.mux = explainContentType(mux)
	return handler, nil
}

// Handler is the API of one node; NewHandler describes what it serves.
type Handler struct {
	mux http.Handler
	// rls is Envoy's rate limit service; nil when it is not served.
	rls *rlsService
	// version is the config the rules came from, for GET /cluster.
	version atomic.Pointer[ConfigVersion]
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// ConfigVersion identifies the configuration a server runs, as GET
// /cluster shows it. The zero value shows nothing known.
type ConfigVersion struct {
	// Generation counts the configurations applied since the process
	// started: 1 at start, +1 per reload applied.
	Generation int64
	// Hash identifies the configuration's source, e.g. the hex SHA-256 of
	// the config file; empty without one.
	Hash string
	// LoadedAt is when it was applied.
	LoadedAt time.Time
}

// Rules are what a server can change while it serves: Envoy's rules and
// the version of the configuration they came from.
type Rules struct {
	// Envoy is Envoy's rules, compiled by CompileEnvoyRules against the
	// policies the node runs (node.SetPolicies): the rules keep their own
	// copy of each. nil means none: every domain is unknown. While Envoy's
	// rate limit service is not served (NewHandler's Config configured no
	// domain and no DropIn), they must serve nothing either: serving it
	// takes a restart.
	Envoy *EnvoyRules
	// Version is shown by GET /cluster.
	Version ConfigVersion
}

// ErrRestartRequired is wrapped by SetRules when the new rules would need
// a service that is not mounted.
var ErrRestartRequired = errors.New("needs a restart")

// SetRules replaces the Envoy rules with one EnvoySwitch.Swap, the same
// switch Config.EnvoyRules names when set: each ShouldRateLimit request is
// decided wholly by the old rules or wholly by the new ones. On error
// nothing changes. Safe for concurrent use with requests; calls are not
// meant to race each other (the last one wins), so one goroutine should
// make them.
func (h *Handler) SetRules(r Rules) error {
	if h.rls == nil {
		if r.Envoy.serves() {
			return fmt.Errorf("envoy: serving Envoy's rate limit service %w (it was not configured at start)", ErrRestartRequired)
		}
	} else {
		h.rls.rules.Swap(r.Envoy)
	}
	v := r.Version
	h.version.Store(&v)
	return nil
}
