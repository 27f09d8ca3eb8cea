package rpc

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/node"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	"github.com/quotad/quotad/rpc/envoy"
)

// This file mounts Envoy's rate limit service (package envoy) on connect-go;
// grpc.go registers it on grpc-go. Both give its errors their codes with
// connectError.

// mountRLS serves Envoy's rate limit service on mux when cfg.Envoy is set,
// with the handler options opts, and returns the service and the names of
// the services it mounted (for reflection): none, and nil, when cfg.Envoy
// is nil. cfg is defaulted and validated.
func mountRLS(mux *http.ServeMux, n *node.Node, cfg Config, opts ...connect.HandlerOption) (*envoy.Service, []string, error) {
	if cfg.Envoy == nil {
		return nil, nil, nil
	}
	svc, err := envoy.NewService(n, cfg.Envoy, cfg.MaxBatch, cfg.Telemetry.MeterProvider)
	if err != nil {
		return nil, nil, err
	}
	mux.Handle(ratelimitv3connect.NewRateLimitServiceHandler(rlsHandler{svc}, opts...))
	return svc, []string{ratelimitv3connect.RateLimitServiceName}, nil
}

// rlsHandler is Envoy's rate limit service on connect-go: svc, with the
// messages wrapped as connect-go wants them.
type rlsHandler struct{ svc *envoy.Service }

var _ ratelimitv3connect.RateLimitServiceHandler = rlsHandler{}

// ShouldRateLimit implements RateLimitService.ShouldRateLimit.
func (h rlsHandler) ShouldRateLimit(ctx context.Context, req *connect.Request[rlsv3.RateLimitRequest]) (*connect.Response[rlsv3.RateLimitResponse], error) {
	res, err := h.svc.ShouldRateLimit(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}
