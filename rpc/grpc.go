package rpc

import (
	"context"
	"log/slog"
	"runtime/debug"
	"strings"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // gRPC clients may compress, as connect-go accepts
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
	"github.com/quotad/quotad/rpc/envoy"
	"github.com/quotad/quotad/rpc/guard"
)

// This file is the gRPC front end: the API's services registered on
// grpc-go's server, whose HTTP/2 transport is much cheaper per call than
// net/http's with connect-go. Its methods call the same service core as
// the Connect handlers (service and envoy.Service), give errors their codes
// with the same connectError, and are observed by the same callTelemetry;
// only the wire differs. The service descriptions are written here rather
// than generated (protoc-gen-go-grpc would add an interface per service
// and a plugin to the build for five methods); TestGRPCMethodsMatchProto
// holds them to the proto files.

// grpcFront builds the grpc-go registrations of the API.
type grpcFront struct {
	tel   *callTelemetry
	admin *adminGuard // nil: no admin token
	log   *slog.Logger
	// maxCallBytes bounds the request message of every call but CheckBatch
	// and ShouldRateLimit, as MaxCallRequestBytes does on the Connect front
	// end (grpc-go's own bound, MaxRecvMsgSize, is the server's, for all
	// methods). 0: no bound beyond grpc-go's.
	maxCallBytes int
}

// grpcUnary is the grpc-go method of the unary procedure (its full name,
// "/quotad.v1.QuotaService/Check") whose core is core. The method decodes
// the request, keeps its connection busy for the connection cap, observes
// the call, refuses an admin call without the admin token, gives an error
// its code as the Connect front end does, and turns a panic into Internal
// as connect-go's recover option does there. It does all that inline and
// ignores the server's unary interceptor (guard.CallsInterceptor, for health),
// which would cost a closure per call.
func grpcUnary[Req any, PReq interface {
	*Req
	proto.Message
}, Res proto.Message](f grpcFront, procedure string, core func(context.Context, PReq) (Res, error)) grpc.MethodDesc {
	p := f.tel.procedure(procedure)
	admin := f.admin != nil && isAdminProcedure(procedure)
	maxBytes := f.maxCallBytes
	if carriesManyChecks(procedure) {
		maxBytes = 0
	}
	return grpc.MethodDesc{
		MethodName: procedure[strings.LastIndexByte(procedure, '/')+1:],
		Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (_ any, err error) {
			req := PReq(new(Req))
			r := grpcRequest{msg: req, maxBytes: maxBytes}
			if err := dec(&r); err != nil {
				return nil, err // grpc-go has answered already
			}
			if r.size > 0 {
				// Refused before decoding, as connect-go refuses it.
				return nil, grpcError(tooLargeError(r.size, maxBytes))
			}
			if r.err != nil {
				// connect-go fails such a request before its interceptors
				// run, so telemetry does not see it there either.
				return nil, grpcError(decodeError(req, r.err))
			}
			// The connection is busy while the call runs (guard.ConnLimiter).
			conn := guard.CallConn(ctx)
			conn.Begin()
			defer conn.End()
			var md metadata.MD
			if f.tel.tracing() || f.admin != nil {
				md, _ = metadata.FromIncomingContext(ctx)
			}
			var carrier propagation.TextMapCarrier
			if f.tel.tracing() {
				carrier = metadataCarrier(md)
			}
			ctx, c := f.tel.start(ctx, p, systemGRPC, carrier)
			defer func() {
				if r := recover(); r != nil {
					f.log.ErrorContext(ctx, "panic in handler", "procedure", procedure, "panic", r, "stack", string(debug.Stack()))
					ce := connect.NewError(connect.CodeInternal, errInternal)
					c.end(ctx, ce)
					err = grpcError(ce)
				}
			}()
			if admin {
				if err := f.admin.check(ctx, procedure, metadataCarrier(md).Get("authorization"), metadataCarrier(md).Get(":authority"), peerAddr(ctx)); err != nil {
					ce := connectError(ctx, f.log, procedure, err)
					c.end(ctx, ce)
					return nil, grpcError(ce)
				}
			}
			res, err := core(ctx, req)
			if err != nil {
				ce := connectError(ctx, f.log, procedure, err)
				c.end(ctx, ce)
				return nil, grpcError(ce)
			}
			c.end(ctx, nil)
			return res, nil
		},
	}
}

// quotaService is quotad.v1.QuotaService on grpc-go, over svc.
func (f grpcFront) quotaService(svc *service) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: quotadv1connect.QuotaServiceName,
		// The methods are closures over svc; RegisterService gets no
		// implementation to check against an interface.
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			grpcUnary(f, quotadv1connect.QuotaServiceCheckProcedure, svc.checkNow),
			grpcUnary(f, quotadv1connect.QuotaServiceCheckBatchProcedure, func(ctx context.Context, req *quotadv1.CheckBatchRequest) (*quotadv1.CheckBatchResponse, error) {
				return svc.checkBatch(ctx, quotadv1connect.QuotaServiceCheckBatchProcedure, req)
			}),
			grpcUnary(f, quotadv1connect.QuotaServiceResetProcedure, svc.reset),
			grpcUnary(f, quotadv1connect.QuotaServiceListPoliciesProcedure, svc.listPolicies),
			grpcUnary(f, quotadv1connect.QuotaServiceRenewSlotProcedure, svc.renewSlot),
			grpcUnary(f, quotadv1connect.QuotaServiceReleaseSlotProcedure, svc.releaseSlot),
			grpcUnary(f, quotadv1connect.QuotaServiceAcquireLeaseProcedure, svc.acquireLease),
			grpcUnary(f, quotadv1connect.QuotaServiceReturnLeaseProcedure, svc.returnLease),
			grpcUnary(f, quotadv1connect.QuotaServiceReserveProcedure, svc.reserve),
			grpcUnary(f, quotadv1connect.QuotaServiceSettleProcedure, svc.settle),
		},
		Metadata: "quotad/v1/quota.proto",
	}
}

// rateLimitService is Envoy's envoy.service.ratelimit.v3.RateLimitService
// on grpc-go, over rls.
func (f grpcFront) rateLimitService(rls *envoy.Service) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: ratelimitv3connect.RateLimitServiceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			grpcUnary[rlsv3.RateLimitRequest](f, ratelimitv3connect.RateLimitServiceShouldRateLimitProcedure, rls.ShouldRateLimit),
		},
		Metadata: "envoy/service/ratelimit/v3/rls.proto",
	}
}

// peerAddr is the address of the call's client, for the log.
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// metadataCarrier reads trace context from gRPC request metadata, whose
// keys are lower-case.
type metadataCarrier metadata.MD

var _ propagation.TextMapCarrier = metadataCarrier(nil)

func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
