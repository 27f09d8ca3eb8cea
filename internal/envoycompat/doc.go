// Package envoycompat holds only a test: a stock Envoy rate limit client,
// go-control-plane's generated one over grpc-go, calling a quotad binary.
//
// It is a package of its own because go-control-plane registers the same
// protobuf names as quotad's wire-compatible copy (proto/envoy), and
// protobuf-go refuses (panics on) two registrations of one name in one
// binary: the stock client and quotad's handler can only meet over the wire,
// which is what the test is for.
package envoycompat
