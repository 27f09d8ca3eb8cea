package rpc

import (
	"context"
	"crypto/sha256"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// With an admin token Reset needs it, over every protocol; checks do not.
// Without one, Reset is open as before.
func TestAdminToken(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{AdminToken: "t0ken"})
	reset := &quotadv1.ResetRequest{Policy: "demo", Key: "k"}
	for _, protocol := range []string{"connect", "grpc", "grpcweb"} {
		c := ts.client(t, protocol)
		for _, tc := range []struct {
			header string
			want   connect.Code // 0: allowed
		}{
			{"", connect.CodeUnauthenticated},
			{"Basic dXNlcjpwdw==", connect.CodeUnauthenticated},
			{"Bearer", connect.CodeUnauthenticated},
			{"Bearer t0ke", connect.CodePermissionDenied},
			{"Bearer t0ken2", connect.CodePermissionDenied},
			{"Bearer t0ken", 0},
			{"bearer  t0ken ", 0},
		} {
			req := connect.NewRequest(reset)
			if tc.header != "" {
				req.Header().Set("Authorization", tc.header)
			}
			_, err := c.Reset(context.Background(), req)
			if got := connect.CodeOf(err); err != nil && got != tc.want || err == nil && tc.want != 0 {
				t.Errorf("%s, Authorization %q: %v, want code %v", protocol, tc.header, err, tc.want)
			}
		}
		if _, err := c.Check(context.Background(), connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: fw5()})); err != nil {
			t.Errorf("%s: a check without a token: %v", protocol, err)
		}
	}
	if !strings.Contains(ts.log.String(), "admin call refused") || strings.Contains(ts.log.String(), "t0ke") {
		t.Errorf("the log should record refusals without tokens:\n%s", ts.log)
	}

	open := startServer(t, memory.New(nil, 0), Config{})
	if _, err := open.client(t, "connect").Reset(context.Background(), connect.NewRequest(reset)); err != nil {
		t.Errorf("Reset on a server without a token: %v", err)
	}
}

func TestAdminProcedures(t *testing.T) {
	if !isAdminProcedure(quotadv1connect.QuotaServiceResetProcedure) {
		t.Error("Reset is not an admin call")
	}
	for _, p := range []string{quotadv1connect.QuotaServiceCheckProcedure, quotadv1connect.QuotaServiceCheckBatchProcedure, quotadv1connect.QuotaServiceListPoliciesProcedure} {
		if isAdminProcedure(p) {
			t.Errorf("%s needs the admin token", p)
		}
	}
	want := sha256.Sum256([]byte("x"))
	if err := checkBearer(want, ""); err != errAdminTokenMissing {
		t.Errorf("no header: %v", err)
	}
}
