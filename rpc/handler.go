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
	"github.com/quotad/quotad/proto/envoy/service/rate_limit_quota/v3/ratelimitquotav3connect"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
	"github.com/quotad/quotad/rpc/console"
	"github.com/quotad/quotad/rpc/envoy"
	"github.com/quotad/quotad/rpc/rlqs"
)

// NewHandler returns the API of node n as one http.Handler:
//
//   - quotad.v1.QuotaService over Connect, gRPC, gRPC-Web and Connect's
//     HTTP/JSON (POST /quotad.v1.QuotaService/Check with
//     Content-Type: application/json);
//   - envoy.service.ratelimit.v3.RateLimitService, Envoy's rate limit
//     service, when cfg.Envoy is set;
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
// The console, /status and /cluster answer only requests whose Host the
// server knows as its own (Config.AllowedHosts and Listen; others get
// 403), and so do admin calls on a server without an admin token (others
// fail with PermissionDenied): a guard against DNS rebinding
// (host_check.go). Other calls and pages answer any Host.
//
// Serve the handler with NewServer, which also serves gRPC connections on
// grpc-go's faster transport (the same services, the same core), or alone
// with an http.Server whose Protocols enable HTTP/1 and unencrypted HTTP/2
// (h2c), or over TLS. cfg is defaulted and validated; log may be nil
// (discard). The handler is safe for concurrent use; SetRules changes the
// Envoy rules it serves by.
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
	// Telemetry goes first, around errorInterceptor, so that spans and
	// metrics see the codes clients get.
	tel, err := newCallTelemetry(cfg.Telemetry, apiProcedures)
	if err != nil {
		return nil, err
	}
	var interceptors []connect.Interceptor
	if tel != nil {
		interceptors = append(interceptors, tel.connectInterceptor())
	}
	svc := &service{
		node:     n,
		policies: policyResolver{inlineAllowed: !cfg.DisableInlineLimits, maxInlinePeriod: cfg.MaxInlinePeriod},
		maxBatch: cfg.MaxBatch,
		// Client leases: lease_rpc.go.
		noClientLeases: cfg.DisableClientLeases,
		log:            log,
		tracer:         cfg.Telemetry.tracer(),
	}
	mux := http.NewServeMux()
	interceptors = append(interceptors, errorInterceptor(log))
	hosts := newHostPolicy(cfg.Listen, cfg.AllowedHosts)
	admin := newAdminGuard(cfg.AdminToken, hosts, log)
	if admin != nil {
		// Inside errorInterceptor, which gives its refusals their codes.
		interceptors = append(interceptors, admin.interceptor())
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
	reflected := append([]string{quotadv1connect.QuotaServiceName, grpchealth.HealthV1ServiceName}, envoyServices...)
	if cfg.RLQS != nil {
		reflected = append(reflected, ratelimitquotav3connect.RateLimitQuotaServiceName)
	}
	handler := &Handler{
		svc: svc, rls: rls, envoyRules: cfg.Envoy, rlqs: cfg.RLQS, health: h, reflected: reflected,
		tel: tel, log: log, maxRequestBytes: cfg.MaxRequestBytes, admin: admin,
	}
	handler.version.Store(&cfg.ConfigVersion)
	reflector := grpcreflect.NewStaticReflector(reflected...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, common, callLimits))
	// Many tools (grpcurl among them) still ask v1alpha first.
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, common, callLimits))
	mux.Handle(grpchealth.NewHandler(h, common, callLimits))
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.Handle("GET /cluster", hosts.page(clusterPage(n, &handler.version)))
	mux.Handle("GET /status", hosts.page(statusPage(n, cfg, time.Now(), newMemberAsker(cfg.Members, cfg.Listen))))
	if !cfg.DisableConsole {
		c := hosts.page(console.Handler())
		mux.Handle("GET /{$}", c)
		mux.Handle("GET /console/", c)
	}
	handler.mux = explainContentType(mux)
	if admin != nil && !admin.token {
		handler.mux = withAdminHost(handler.mux)
	}
	return handler, nil
}

// Handler is a node's API as NewHandler describes it: net/http's handler,
// and what NewServer needs to serve the same services on grpc-go.
type Handler struct {
	mux http.Handler
	// The service core, shared with the gRPC front end.
	svc *service
	// rls is Envoy's rate limit service, and envoyRules the rules it
	// decides by; both nil when it is not served.
	rls        *envoy.Service
	envoyRules *envoy.Switch
	// rlqs is Envoy's rate limit quota service, gRPC only; nil when it is
	// not served.
	rlqs *rlqs.Service
	// health and reflected (the services reflection lists) are shared too.
	health          *Health
	reflected       []string
	tel             *callTelemetry // nil: no telemetry
	log             *slog.Logger
	maxRequestBytes int
	// admin guards the admin procedures on both front ends; nil when
	// Config.AdminToken is empty.
	admin *adminGuard
	// version is the config the rules came from, for GET /cluster.
	version atomic.Pointer[ConfigVersion]
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Rules are what a server can change while it serves: Envoy's rules and
// the version of the configuration they came from.
type Rules struct {
	// Envoy is Envoy's rules, compiled by envoy.Compile against the
	// policies the node runs (node.SetPolicies): the rules keep their own
	// copy of each. nil means none: every domain is unknown. While Envoy's
	// rate limit service is not served (NewHandler's Config.Envoy was nil),
	// they must serve nothing either: serving it takes a restart.
	Envoy *envoy.Rules
	// Version is shown by GET /cluster.
	Version ConfigVersion
}

// ErrRestartRequired is wrapped by SetRules when the new rules would need
// a service that is not mounted.
var ErrRestartRequired = errors.New("needs a restart")

// SetRules replaces the Envoy rules with one Swap of the switch NewHandler's
// Config.Envoy named: each ShouldRateLimit request is
// decided wholly by the old rules or wholly by the new ones. On error
// nothing changes. Safe for concurrent use with requests; calls are not
// meant to race each other (the last one wins), so one goroutine should
// make them.
func (h *Handler) SetRules(r Rules) error {
	if h.rls == nil {
		if r.Envoy.Serves() {
			return fmt.Errorf("envoy: serving Envoy's rate limit service %w (it was not configured at start)", ErrRestartRequired)
		}
	} else {
		h.envoyRules.Swap(r.Envoy)
	}
	v := r.Version
	h.version.Store(&v)
	return nil
}
