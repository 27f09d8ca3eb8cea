package rpc

import (
	"fmt"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// MaxCallRequestBytes bounds the request message of every call but the
// two that carry many checks (CheckBatch, and Envoy's ShouldRateLimit,
// which Config.MaxRequestBytes bounds): a Check, Reset, RenewSlot or
// ReleaseSlot at every field's maximum (a 1 KiB key, a 128-byte policy, an
// inline limit) is 1.2 KB in protobuf and 1.3 KB in JSON, 6.5 KB if every
// byte of its key is a control character JSON escapes; health and
// reflection requests are smaller still. A smaller Config.MaxRequestBytes
// bounds these calls too.
//
// The bound is what keeps those calls' memory small. connect-go reads a
// request message, and inflates a compressed one, into buffers that it
// grows by doubling and keeps in a pool per procedure for reuse, up to
// 8 MiB each: a message as large as the bound leaves a buffer of twice
// its size in the pool, and the steady stream of Checks then reuses it
// forever. Under a 4 MiB bound, gzip bombs posted as Checks left 8 MiB
// buffers in Check's pool (152 MB of a 198 MB heap in the soak of issue
// 10), and reading them into buffers that grew (each growth a new, zeroed
// allocation) took a quarter of the attacked node's CPU.
const MaxCallRequestBytes = 64 << 10

// messageLimits bounds a request message at maxBytes, after decompression,
// where inflating also stops (boundedGzip): larger ones fail with
// ResourceExhausted, compressed or not; no more than maxBytes+1 bytes of
// one are held in memory.
func messageLimits(maxBytes int) connect.HandlerOption {
	return connect.WithHandlerOptions(
		connect.WithReadMaxBytes(maxBytes),
		boundedGzip(maxBytes),
	)
}

// carriesManyChecks reports whether procedure is one of the two calls
// Config.MaxRequestBytes bounds rather than MaxCallRequestBytes.
func carriesManyChecks(procedure string) bool {
	return procedure == quotadv1connect.QuotaServiceCheckBatchProcedure ||
		procedure == ratelimitv3connect.RateLimitServiceShouldRateLimitProcedure
}

// tooLargeError is the refusal of a request message of size bytes over
// the bound maxBytes, in connect-go's words, so that both front ends
// answer alike.
func tooLargeError(size, maxBytes int) *connect.Error {
	return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("message size %d is larger than configured max %d", size, maxBytes))
}
