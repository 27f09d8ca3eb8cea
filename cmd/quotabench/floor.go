package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// The gRPC floor: a bare grpc-go server, default options, whose handlers
// decode the request and return a constant response. It costs what any
// grpc-go unary server costs per call (HTTP/2 framing, one goroutine per
// stream, protobuf decoding and encoding) and nothing else, so quotad's
// CPU per check divided by the floor's is what quotad adds on top of a
// gRPC server. The matrix starts it as a process of its own (quotabench
// re-executed with the hidden subcommand floorCommand), so that its CPU is
// read apart from the load generator's.

// floorCommand is the hidden subcommand that runs the floor server.
const floorCommand = "floor-server"

// The constant answers: shaped like a hot key's answer (allowed, from a
// lease, with a reset time), so the floor encodes as many bytes as quotad.
var (
	floorCheckResponse = &quotadv1.CheckResponse{
		Allowed: true, Limit: 4_000_000_000, Remaining: 3_999_999_000,
		ResetAfter: durationpb.New(900 * time.Millisecond), Source: quotadv1.Source_SOURCE_LEASE,
	}
	floorRLSResponse = &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code:               rlsv3.RateLimitResponse_OK,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 4_000_000_000, Unit: rlsv3.RateLimitResponse_RateLimit_HOUR},
			LimitRemaining:     3_999_999_000,
			DurationUntilReset: durationpb.New(900 * time.Millisecond),
		}},
	}
)

// floorServices are the floor's two methods, the ones the matrix calls on
// quotad for single checks. HandlerType any: the descriptions need no
// implementation, their handlers are self-contained.
var floorServices = []grpc.ServiceDesc{
	{
		ServiceName: "quotad.v1.QuotaService",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Check", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var req quotadv1.CheckRequest
			if err := dec(&req); err != nil {
				return nil, err
			}
			return floorCheckResponse, nil
		}}},
	},
	{
		ServiceName: "envoy.service.ratelimit.v3.RateLimitService",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var req rlsv3.RateLimitRequest
			if err := dec(&req); err != nil {
				return nil, err
			}
			return floorRLSResponse, nil
		}}},
	},
}

// runFloorServer serves the floor on a fresh 127.0.0.1 port, prints
// "listening on HOST:PORT" to stdout, and serves until stdin reaches its
// end (the matrix closes it, or dies) or ctx is done.
func runFloorServer(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments", floorCommand)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	for i := range floorServices {
		s.RegisterService(&floorServices[i], struct{}{})
	}
	if _, err := fmt.Fprintf(stdout, "listening on %s\n", ln.Addr()); err != nil {
		ln.Close()
		return err
	}
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, stdin)
		close(stop)
	}()
	go func() {
		select {
		case <-stop:
		case <-ctx.Done():
		}
		s.Stop()
	}()
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
