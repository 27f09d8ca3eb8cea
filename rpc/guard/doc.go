// Package guard protects a server's listener and its connections from
// the clients on them, below any handler: what a connection may hold of
// the server (a slot, bytes, time) before and while it is served. It
// knows no API and no type of quotad's; package rpc stacks its parts in
// front of its two front ends:
//
//   - LimitListener (listener.go) accepts connections within a
//     ConnLimiter (conn_limit.go), the cap on open connections that
//     closes the longest idle one to make room; ends TLS; and puts each
//     connection behind the HTTP/2 rapid-reset guard (h2_resets.go),
//     whose GOAWAYs ResetStats counts.
//   - SplitListener (split.go) routes each connection by its first
//     request, to grpc-go (gRPC with protobuf) or to net/http, reading
//     that request within bounds of bytes and time (sniff.go) and
//     handing the connection on with what it read in front (replay.go).
//   - ConnCredentials, CallsInterceptor and StreamsInterceptor
//     (grpc_calls.go) let grpc-go's calls mark their connections busy for
//     the cap; net/http's connections report through ConnLimiter.ConnState.
//   - BodyDeadline (body_deadline.go) gives each request body a time to
//     arrive in, without bounding the response.
//
// The guards share the HTTP/2 framing they read and write (h2_frames.go)
// and the spacing of the warnings they log about clients (warn.go).
package guard
