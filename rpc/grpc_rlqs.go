package rpc

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	rlqsv3 "github.com/quotad/quotad/proto/envoy/service/rate_limit_quota/v3"
	"github.com/quotad/quotad/proto/envoy/service/rate_limit_quota/v3/ratelimitquotav3connect"
	"github.com/quotad/quotad/rpc/guard"
	"github.com/quotad/quotad/rpc/rlqs"
)

// This file mounts Envoy's rate limit quota service on the gRPC front
// end, the only one Envoy's rate_limit_quota filter calls it on: one
// bidirectional stream per Envoy, run by rlqs.Service.Serve.

// rateLimitQuotaService is envoy.service.rate_limit_quota.v3's
// RateLimitQuotaService on grpc-go, over svc.
func (f grpcFront) rateLimitQuotaService(svc *rlqs.Service) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: ratelimitquotav3connect.RateLimitQuotaServiceName,
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "StreamRateLimitQuotas",
			ServerStreams: true,
			ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				// A stream lives as long as its Envoy: its connection is
				// busy all along (guard.ConnLimiter).
				conn := guard.CallConn(ss.Context())
				conn.Begin()
				defer conn.End()
				err := svc.Serve(ss.Context(), rlqsStream{ss})
				return rlqsError(err)
			},
		}},
		Metadata: "envoy/service/rate_limit_quota/v3/rlqs.proto",
	}
}

// rlqsStream is a grpc-go stream as rlqs.Stream.
type rlqsStream struct{ grpc.ServerStream }

func (s rlqsStream) Recv() (*rlqsv3.RateLimitQuotaUsageReports, error) {
	m := new(rlqsv3.RateLimitQuotaUsageReports)
	if err := s.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

func (s rlqsStream) Send(m *rlqsv3.RateLimitQuotaResponse) error { return s.SendMsg(m) }

// rlqsError gives a stream's end its code: a refused report says which
// field to fix; grpc-go's own errors keep theirs.
func rlqsError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, rlqs.ErrUnknownDomain):
		return grpcstatus.Error(codes.NotFound, err.Error())
	case errors.Is(err, rlqs.ErrInvalidReport):
		return grpcstatus.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return grpcstatus.Error(codes.Canceled, err.Error())
	}
	return err
}
