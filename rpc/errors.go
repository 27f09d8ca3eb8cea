package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"

	"connectrpc.com/connect"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/rpc/envoy"
)

// Errors of this package. Each is wrapped with the field it concerns; code
// maps them to Connect codes.
var (
	// errInvalidRequest: the request is malformed in a way only the wire
	// can see (a batch of the wrong size).
	errInvalidRequest = algorithms.NewInputError("invalid request")
	// errInlineDisabled: the request carries a limit, and this server only
	// serves configured policies.
	errInlineDisabled = errors.New("inline limits are disabled on this server; use a configured policy")
	// errPolicyConfigured: the request carries a limit under the name of a
	// configured policy. Refused so that a client cannot replace a
	// configured policy's limit with a bigger one of its own. The text
	// continues a message that starts with the policy's name.
	errPolicyConfigured = algorithms.NewInputError("is configured on this server; omit limit or choose another namespace")
	// errInternal is the whole message of every Internal error: details
	// stay in the server's log.
	errInternal = errors.New("internal error (details are in the server's log)")
	// errUnavailable is the whole message of every Unavailable error but
	// errOverloaded.
	errUnavailable = errors.New("the quota store is unavailable; retry later (details are in the server's log)")
	// errOverloaded is the whole message of an Unavailable error for a
	// check the node shed (node.ErrOverloaded).
	errOverloaded = errors.New("this quotad node is overloaded and shed the check without deciding it; retry after a backoff, or spread the load over more nodes")
)

// code chooses the Connect code of err, an error of the call whose context
// is ctx. It is the only place in quotad that does: input problems (every
// error that wraps node.ErrInvalidInput, Envoy's malformed requests among
// them) are InvalidArgument, an unknown policy or Envoy domain
// (envoy.ErrUnknownDomain), and a concurrency
// slot that is not held (never taken, released or expired), are NotFound,
// a client lease that is not held (returned, expired, granted elsewhere) is
// NotFound too, inline limits on a server that forbids them are PermissionDenied, so is an
// admin call with the wrong token (without one it is Unauthenticated) and,
// on a server without a token, one whose Host is not allowed, the
// caller's context ending is Canceled or DeadlineExceeded, a full memory store
// is ResourceExhausted, a failed store (node.ErrStore: on Reset and on a
// slot's renew or release; checks take the policy's failure mode instead) is
// Unavailable, so is a check an overloaded node shed (node.ErrOverloaded:
// retryable, here later or on another node), a store that keeps no
// reservations (node.ErrNoReservations) is Unimplemented, so is a reset the
// store cannot do (node.ErrResetUnsupported), and everything
// else is Internal. (decodeError,
// below, is the gRPC front end's copy of what connect-go answers to a request
// that does not decode.)
func code(ctx context.Context, err error) connect.Code {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return ce.Code()
	case errors.Is(err, errInlineDisabled), errors.Is(err, errAdminTokenWrong), errors.Is(err, errHostNotAllowed):
		return connect.CodePermissionDenied
	case errors.Is(err, errAdminTokenMissing):
		return connect.CodeUnauthenticated
	case errors.Is(err, node.ErrUnknownPolicy), errors.Is(err, envoy.ErrUnknownDomain):
		return connect.CodeNotFound
	case errors.Is(err, node.ErrSlotNotHeld), errors.Is(err, node.ErrLeaseNotHeld):
		// The slot is an entity that no longer exists, as etcd answers a
		// keep-alive or revoke of an expired lease. Not FailedPrecondition:
		// no change of state makes the same renew or release succeed, and
		// the holder's only move is to stop and, if it still has work,
		// check again.
		return connect.CodeNotFound
	case errors.Is(err, node.ErrInvalidInput):
		return connect.CodeInvalidArgument
	case errors.Is(err, node.ErrNoReservations), errors.Is(err, node.ErrResetUnsupported):
		return connect.CodeUnimplemented
	case errors.Is(err, node.ErrStoreFull):
		// The memory store refuses new keys until some expire: retryable,
		// and the client's doing only in aggregate.
		return connect.CodeResourceExhausted
	case errors.Is(err, node.ErrStore):
		// Retryable: the store did not answer; a later call may succeed.
		return connect.CodeUnavailable
	case errors.Is(err, node.ErrOverloaded):
		// Retryable, and not the caller's doing: the node could not decide
		// in time. Not ResourceExhausted, which a rate limiter's client may
		// read as its own quota spent; Unavailable is what clients and
		// proxies retry elsewhere, and what Envoy's failure mode handles.
		return connect.CodeUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The store bounds its calls with timeouts of its own, and those
		// wrap context.DeadlineExceeded too. Only the caller's context
		// ending is the caller's doing; a server-side timeout is ours.
		switch {
		case errors.Is(ctx.Err(), context.Canceled):
			return connect.CodeCanceled
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			return connect.CodeDeadlineExceeded
		}
	}
	return connect.CodeInternal
}

// connectError turns err into the error a client sees. Internal and
// Unavailable errors are logged with their detail and leave with a generic
// message, so that nothing about the server's internals (Redis addresses, script errors)
// reaches a client. A shed check (node.ErrOverloaded) is not logged: an
// overloaded node sheds many a second, and counts them
// (node.Stats.StoreOverloads).
func connectError(ctx context.Context, log *slog.Logger, procedure string, err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	c := code(ctx, err)
	switch c {
	case connect.CodeInternal:
		log.ErrorContext(ctx, "internal error", "procedure", procedure, "err", err)
		return connect.NewError(c, errInternal)
	case connect.CodeUnavailable:
		if errors.Is(err, node.ErrOverloaded) {
			return connect.NewError(c, errOverloaded)
		}
		log.WarnContext(ctx, "store unavailable", "procedure", procedure, "err", err)
		return connect.NewError(c, errUnavailable)
	}
	return connect.NewError(c, err)
}

// errorInterceptor gives every error a handler returns its Connect code, so
// that handlers return plain, wrapped domain errors.
func errorInterceptor(log *slog.Logger) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			res, err := next(ctx, req)
			if err != nil {
				return nil, connectError(ctx, log, req.Spec().Procedure, err)
			}
			return res, nil
		}
	})
}

// recoverPanic is defence in depth: no handler is meant to panic, but if
// one does, the client gets Internal and the log gets the stack, instead of
// net/http dropping the connection.
func recoverPanic(log *slog.Logger) connect.HandlerOption {
	return connect.WithRecover(func(ctx context.Context, spec connect.Spec, _ http.Header, panicked any) error {
		log.ErrorContext(ctx, "panic in handler", "procedure", spec.Procedure, "panic", panicked, "stack", string(debug.Stack()))
		return connect.NewError(connect.CodeInternal, errInternal)
	})
}

// grpcError is ce as the gRPC front end returns it: a gRPC status of the
// same code (gRPC and Connect number their codes alike) and message.
func grpcError(ce *connect.Error) error {
	return grpcstatus.Error(codes.Code(ce.Code()), ce.Message())
}

// decodeError is the error of a request message req that did not decode
// (err), as the Connect front end reports it: the client's fault.
func decodeError(req any, err error) *connect.Error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unmarshal message: unmarshal into %T: %w", req, err))
}
