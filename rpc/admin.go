package rpc

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"strings"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// isAdminProcedure reports whether procedure changes state for every
// client, so that Config.AdminToken guards it.
func isAdminProcedure(procedure string) bool {
	return procedure == quotadv1connect.QuotaServiceResetProcedure
}

// adminGuard refuses admin calls that do not carry the admin token as
// "Authorization: Bearer <token>": errAdminTokenMissing without a bearer
// token, errAdminTokenWrong with another one. Both front ends ask it, so a
// call is refused alike over Connect and over gRPC on grpc-go. Tokens are
// compared by their SHA-256 digests in constant time, so the time a refusal
// takes tells nothing about the token, its length included. Safe for
// concurrent use.
type adminGuard struct {
	want [sha256.Size]byte
	log  *slog.Logger
}

// newAdminGuard returns the guard of token; nil (no guard) when token is
// empty.
func newAdminGuard(token string, log *slog.Logger) *adminGuard {
	if token == "" {
		return nil
	}
	return &adminGuard{want: sha256.Sum256([]byte(token)), log: log}
}

// check lets a call of procedure through, or refuses it, given its
// Authorization header (authorization) and its peer's address (for the
// log). Calls of other than admin procedures always pass.
func (g *adminGuard) check(ctx context.Context, procedure, authorization, peer string) error {
	if g == nil || !isAdminProcedure(procedure) {
		return nil
	}
	if err := checkBearer(g.want, authorization); err != nil {
		// An audit trail of who tried: the peer, never the token.
		g.log.WarnContext(ctx, "admin call refused", "procedure", procedure, "peer", peer, "err", err)
		return err
	}
	return nil
}

// interceptor asks the guard about the Connect front end's calls.
func (g *adminGuard) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			procedure := req.Spec().Procedure
			if isAdminProcedure(procedure) {
				if err := g.check(ctx, procedure, req.Header().Get("Authorization"), req.Peer().Addr); err != nil {
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
