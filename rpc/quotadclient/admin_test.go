package quotadclient_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// Reset sends Options.AdminToken, over every protocol; a quotad with a
// token refuses a client without it (Unauthenticated) or with another
// (PermissionDenied).
func TestResetWithAdminToken(t *testing.T) {
	url := startQuotad(t, nil, rpc.Config{AdminToken: "t0ken"}, threeAMinute)
	for _, p := range protocols {
		for _, tc := range []struct {
			token string
			want  connect.Code // 0: done
		}{{"", connect.CodeUnauthenticated}, {"other", connect.CodePermissionDenied}, {"t0ken", 0}} {
			c, err := quotadclient.New(url, quotadclient.Options{Protocol: p, AdminToken: tc.token})
			if err != nil {
				t.Fatal(err)
			}
			err = c.Reset(context.Background(), "api", "k")
			c.Close()
			if got := connect.CodeOf(err); err != nil && got != tc.want || err == nil && tc.want != 0 {
				t.Errorf("%s, token %q: %v, want code %v", p, tc.token, err, tc.want)
			}
		}
	}
}

func TestNewRejectsBadTLSAndTokenOptions(t *testing.T) {
	for name, o := range map[string]quotadclient.Options{
		"TLSConfig with HTTPClient": {TLSConfig: &tls.Config{}, HTTPClient: http.DefaultClient},
		"token with a newline":      {AdminToken: "a\nb"},
		"token with a space":        {AdminToken: "a b"},
	} {
		if _, err := quotadclient.New("https://localhost:8443", o); !errors.Is(err, quotadclient.ErrInvalidOptions) {
			t.Errorf("%s: %v, want ErrInvalidOptions", name, err)
		}
	}
}
