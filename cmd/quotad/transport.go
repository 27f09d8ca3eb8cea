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

func transportSettings() []setting {
	return []setting{
		{name: "grpc-transport", usage: "grpc-go: connections whose first request is gRPC are served by grpc-go's transport (a fraction of the CPU per call); connect: every connection by net/http and connect-go, for a proxy in front that mixes gRPC and other requests on one HTTP/2 connection", apply: func(c *config, v string) error { c.GRPCTransport = v; return nil }},
	}
}

func validateGRPCTransport(v string) error {
	switch v {
	case grpcTransportGRPCGo, grpcTransportConnect:
		return nil
	}
	return fmt.Errorf("grpc transport: %q is not grpc-go or connect", v)
}
