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

// adminInterceptor refuses admin calls that do not carry token as
// "Authorization: Bearer <token>": errAdminTokenMissing without a bearer
// token, errAdminTokenWrong with another one. Other calls pass untouched.
// Tokens are compared by their SHA-256 digests in constant time, so the
// time a refusal takes tells nothing about the token, its length included.
func adminInterceptor(token string, log *slog.Logger) connect.Interceptor {
	want := sha256.Sum256([]byte(token))
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			procedure := req.Spec().Procedure
			if !isAdminProcedure(procedure) {
				return next(ctx, req)
			}
			if err := checkBearer(want, req.Header().Get("Authorization")); err != nil {
				// An audit trail of who tried: the peer, never the token.
				log.WarnContext(ctx, "admin call refused", "procedure", procedure, "peer", req.Peer().Addr, "err", err)
				return nil, err
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
