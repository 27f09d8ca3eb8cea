package main

import "fmt"

// How gRPC is served on the API's port (--grpc-transport).
const (
	// grpcTransportGRPCGo serves connections whose first request is gRPC
	// on grpc-go's transport, the rest on net/http.
	grpcTransportGRPCGo = "grpc-go"
	// grpcTransportConnect serves every connection on net/http, gRPC with
	// connect-go.
	grpcTransportConnect = "connect"
)

func validateGRPCTransport(v string) error {
	switch v {
	case grpcTransportGRPCGo, grpcTransportConnect:
		return nil
	}
	return fmt.Errorf("grpc transport: %q is not grpc-go or connect", v)
}
