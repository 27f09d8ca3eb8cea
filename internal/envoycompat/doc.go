// Package envoycompat holds only tests: a stock Envoy rate limit client,
// go-control-plane's generated one over grpc-go, calling a quotad binary,
// configured with quotad's own schema (TestStockClient) or with
// envoyproxy/ratelimit's config files, unchanged: the examples of its
// README (testdata/readme, TestREADMEExamples), its global shadow mode, and
// the directory's hot reload.
//
// It is a package of its own because go-control-plane registers the same
// protobuf names as quotad's wire-compatible copy (proto/envoy), and
// protobuf-go refuses (panics on) two registrations of one name in one
// binary: the stock client and quotad's handler can only meet over the wire,
// which is what the test is for.
package envoycompat
