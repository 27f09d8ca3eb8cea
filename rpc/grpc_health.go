package rpc

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"google.golang.org/grpc"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// This file serves gRPC health and reflection on the gRPC front end, from
// the same readiness (Health) and the same list of services as the Connect
// front end's grpchealth and grpcreflect handlers.

// grpcHealth is grpc.health.v1.Health on grpc-go over h: Check and Watch
// answer as connectrpc.com/grpchealth's handler does for the same Health;
// List is unimplemented there too.
type grpcHealth struct {
	healthv1.UnimplementedHealthServer
	h *Health
}

var _ healthv1.HealthServer = grpcHealth{}

// Check implements healthv1.HealthServer.
func (g grpcHealth) Check(ctx context.Context, req *healthv1.HealthCheckRequest) (*healthv1.HealthCheckResponse, error) {
	res, err := g.h.Check(ctx, &grpchealth.CheckRequest{Service: req.GetService()})
	if err != nil {
		return nil, healthError(err)
	}
	return &healthv1.HealthCheckResponse{Status: healthv1.HealthCheckResponse_ServingStatus(res.Status)}, nil
}

// Watch implements healthv1.HealthServer: the status now, then every
// change, until the client goes or the server stops.
func (g grpcHealth) Watch(req *healthv1.HealthCheckRequest, stream grpc.ServerStreamingServer[healthv1.HealthCheckResponse]) error {
	ctx := stream.Context()
	check := &grpchealth.CheckRequest{Service: req.GetService()}
	changed := make(chan struct{}, 1)
	stop, err := g.h.Watch(ctx, check, func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return healthError(err)
	}
	defer stop()
	last := healthv1.HealthCheckResponse_ServingStatus(-1)
	for {
		res, err := g.h.Check(ctx, check)
		if err != nil {
			return healthError(err)
		}
		if s := healthv1.HealthCheckResponse_ServingStatus(res.Status); s != last {
			if err := stream.Send(&healthv1.HealthCheckResponse{Status: s}); err != nil {
				return err
			}
			last = s
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// healthError is a Health error (NotFound for an unknown service) as a
// gRPC status.
func healthError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return grpcError(ce)
	}
	return grpcError(connect.NewError(connect.CodeInternal, err))
}

// serviceNames lists the services reflection describes, the same on both
// front ends.
type serviceNames []string

var _ reflection.ServiceInfoProvider = serviceNames(nil)

// GetServiceInfo implements reflection.ServiceInfoProvider: reflection
// reads only the names.
func (s serviceNames) GetServiceInfo() map[string]grpc.ServiceInfo {
	m := make(map[string]grpc.ServiceInfo, len(s))
	for _, name := range s {
		m[name] = grpc.ServiceInfo{}
	}
	return m
}
