package rpc

import (
	"fmt"
	"log/slog"
	"net/http"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
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
//     denied-cache figures, as JSON.
//
// Serve the handler with NewServer, which also serves gRPC connections on
// grpc-go's faster transport (the same services, the same core), or alone
// with an http.Server whose Protocols enable HTTP/1 and unencrypted HTTP/2
// (h2c), or over TLS. cfg is defaulted and validated; log may be nil
// (discard). The handler is safe for concurrent use.
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
		connect.WithReadMaxBytes(cfg.MaxRequestBytes),
	)
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
		policies: policyResolver{node: n, inlineAllowed: !cfg.DisableInlineLimits},
		maxBatch: cfg.MaxBatch,
		log:      log,
		tracer:   cfg.Telemetry.tracer(),
	}
	mux := http.NewServeMux()
	rpcInterceptors := connect.WithInterceptors(append(interceptors, errorInterceptor(log))...)
	mux.Handle(quotadv1connect.NewQuotaServiceHandler(svc, common, rpcInterceptors))
	rls, envoyServices, err := mountRLS(mux, n, cfg, common, rpcInterceptors)
	if err != nil {
		return nil, err
	}
	reflected := append([]string{quotadv1connect.QuotaServiceName, grpchealth.HealthV1ServiceName}, envoyServices...)
	reflector := grpcreflect.NewStaticReflector(reflected...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, common))
	// Many tools (grpcurl among them) still ask v1alpha first.
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, common))
	mux.Handle(grpchealth.NewHandler(h, common))
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.HandleFunc("GET /cluster", clusterPage(n))
	return &Handler{
		mux: mux, svc: svc, rls: rls, health: h, reflected: reflected,
		tel: tel, log: log, maxRequestBytes: cfg.MaxRequestBytes,
	}, nil
}

// Handler is a node's API as NewHandler describes it: net/http's handler,
// and what NewServer needs to serve the same services on grpc-go.
type Handler struct {
	mux http.Handler
	// The service core, shared with the gRPC front end.
	svc *service
	rls *rlsService // nil when Envoy's service is not mounted
	// health and reflected (the services reflection lists) are shared too.
	health          *Health
	reflected       []string
	tel             *callTelemetry // nil: no telemetry
	log             *slog.Logger
	maxRequestBytes int
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// apiProcedures are the unary procedures that telemetry observes.
var apiProcedures = []string{
	quotadv1connect.QuotaServiceCheckProcedure,
	quotadv1connect.QuotaServiceCheckBatchProcedure,
	quotadv1connect.QuotaServiceResetProcedure,
	quotadv1connect.QuotaServiceListPoliciesProcedure,
	ratelimitv3connect.RateLimitServiceShouldRateLimitProcedure,
}
