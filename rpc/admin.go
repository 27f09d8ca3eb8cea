package rpc

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"strings"

	"connectrpc.com/connect"
)

// The refusals of an admin call.
var (
	// errAdminTokenMissing: an admin call (Reset) without a bearer token,
	// on a server that has one.
	errAdminTokenMissing = errors.New("this call needs the admin token: send the header Authorization: Bearer <token>")
	// errAdminTokenWrong: an admin call with a bearer token that is not the
	// server's.
	errAdminTokenWrong = errors.New("the admin token is not this server's")
)

// adminGuard refuses admin calls that do not carry the admin token as
// "Authorization: Bearer <token>": errAdminTokenMissing without a bearer
// token, errAdminTokenWrong with another one. On a server without a token
// it refuses instead the admin calls whose Host (gRPC's :authority) its
// host policy does not allow (errHostNotAllowed): with a token, a page
// that rebinds a name of its own to quotad cannot call them anyway, and
// without one, the Host is what tells such a page from the operator. Both
// front ends ask it, so a call is refused alike over Connect and over gRPC
// on grpc-go. Tokens are compared by their SHA-256 digests in constant
// time, so the time a refusal takes tells nothing about the token, its
// length included. Safe for concurrent use.
type adminGuard struct {
	token bool
	want  [sha256.Size]byte
	hosts *hostPolicy
	log   *slog.Logger
}

// newAdminGuard returns the guard of token, or without one of hosts; nil
// (no guard) when token is empty and hosts allows every Host.
func newAdminGuard(token string, hosts *hostPolicy, log *slog.Logger) *adminGuard {
	switch {
	case token != "":
		return &adminGuard{token: true, want: sha256.Sum256([]byte(token)), log: log}
	case hosts != nil && !hosts.any:
		return &adminGuard{hosts: hosts, log: log}
	}
	return nil
}

// check lets a call of procedure through, or refuses it, given its
// Authorization header (authorization), its Host (host) and its peer's
// address (for the log). Calls of other than admin procedures always pass.
func (g *adminGuard) check(ctx context.Context, procedure, authorization, host, peer string) error {
	if g == nil || !isAdminProcedure(procedure) {
		return nil
	}
	var err error
	if g.token {
		err = checkBearer(g.want, authorization)
	} else {
		err = g.hosts.check(host)
	}
	if err != nil {
		// An audit trail of who tried: the peer, never the token.
		g.log.WarnContext(ctx, "admin call refused", "procedure", procedure, "peer", peer, "err", err)
		return err
	}
	return nil
}

// interceptor asks the guard about the Connect front end's calls; their
// Host comes from withAdminHost.
func (g *adminGuard) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			procedure := req.Spec().Procedure
			if isAdminProcedure(procedure) {
				if err := g.check(ctx, procedure, req.Header().Get("Authorization"), requestHost(ctx), req.Peer().Addr); err != nil {
					return nil, err
				}
			}
			return next(ctx, req)
		}
	})
}

// checkBearer checks an Authorization header's value against the digest
// of the expected token.
func checkBearer(want [sha256.Size]byte, header string) error {
	scheme, tok, _ := strings.Cut(strings.TrimSpace(header), " ")
	tok = strings.TrimSpace(tok)
	if !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return errAdminTokenMissing
	}
	got := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return errAdminTokenWrong
	}
	return nil
}
