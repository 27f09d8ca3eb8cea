package quotadclient_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/quotadclient"
)

var protocols = []quotadclient.Protocol{quotadclient.ProtocolConnect, quotadclient.ProtocolGRPC, quotadclient.ProtocolGRPCWeb}

// Every protocol gets the same decisions from a real quotad, counting down
// to a denial with a retry-after, and the configured policy's
// source is the store.
func TestCheckOverEveryProtocol(t *testing.T) {
	url := startQuotad(t, nil, rpc.Config{}, threeAMinute)
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			c := newClient(t, url, p)
			ctx := context.Background()
			key := "user-" + p.String()
			for i := range 3 {
				d, err := c.Check(ctx, "api", key, 1)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed || d.Limit != 3 || d.Remaining != int64(2-i) || d.Source != quotadclient.SourceStore || d.RetryAfter != 0 {
					t.Fatalf("check %d: %+v, want allowed, limit 3, remaining %d, source store", i+1, d, 2-i)
				}
				if d.ResetAfter <= 0 || d.ResetAfter > time.Minute {
					t.Fatalf("check %d: reset after %v, want in (0, 1m]", i+1, d.ResetAfter)
				}
			}
			d, err := c.Check(ctx, "api", key, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
				t.Fatalf("fourth check: %+v, want denied with a retry-after in (0, 1m]", d)
			}
			// Cost 0 reports without spending: still denied, nothing changes.
			if d0, err := c.Check(ctx, "api", key, 0); err != nil || d0.Allowed || d0.Remaining != 0 {
				t.Fatalf("cost 0 after the limit: %+v, %v", d0, err)
			}
		})
	}
}

func TestCheckLimitSendsTheInlineLimit(t *testing.T) {
	url := startQuotad(t, nil, rpc.Config{})
	c := newClient(t, url, quotadclient.ProtocolConnect)
	lim := algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1, Period: time.Minute, Burst: 4}
	d, err := c.CheckLimit(context.Background(), "inline", lim, "k", 3)
	if err != nil {
		t.Fatal(err)
	}
	// Limit in a response is the capacity: the burst, for a bucket.
	if !d.Allowed || d.Limit != 4 || d.Remaining != 1 {
		t.Fatalf("got %+v, want allowed with limit 4 (the burst) and 1 remaining", d)
	}
	if d, err := c.CheckLimit(context.Background(), "inline", lim, "k", 2); err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("second check: %+v, %v; want denied with a retry-after", d, err)
	}
}

// Errors keep quotad's Connect code through the client's wrapping.
func TestCheckErrorsKeepTheirCodes(t *testing.T) {
	url := startQuotad(t, nil, rpc.Config{DisableInlineLimits: true}, threeAMinute)
	ctx := context.Background()
	lim := algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 5, Period: time.Second}
	cases := []struct {
		name string
		url  string
		call func(*quotadclient.Client) error
		want connect.Code
	}{
		{"unknown policy", url, func(c *quotadclient.Client) error { _, err := c.Check(ctx, "nope", "k", 1); return err }, connect.CodeNotFound},
		{"empty key", url, func(c *quotadclient.Client) error { _, err := c.Check(ctx, "api", "", 1); return err }, connect.CodeInvalidArgument},
		{"negative cost", url, func(c *quotadclient.Client) error { _, err := c.Check(ctx, "api", "k", -1); return err }, connect.CodeInvalidArgument},
		{"inline limits off", url, func(c *quotadclient.Client) error { _, err := c.CheckLimit(ctx, "x", lim, "k", 1); return err }, connect.CodePermissionDenied},
		{"unreachable", closedURL(t), func(c *quotadclient.Client) error { _, err := c.Check(ctx, "api", "k", 1); return err }, connect.CodeUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call(newClient(t, tc.url, quotadclient.ProtocolConnect))
			if got := connect.CodeOf(err); got != tc.want {
				t.Fatalf("error %v has code %v, want %v", err, got, tc.want)
			}
			var ce *connect.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v does not unwrap to a *connect.Error", err)
			}
		})
	}
	t.Run("deadline", func(t *testing.T) {
		c := newClient(t, hangingURL(t), quotadclient.ProtocolConnect)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.Check(ctx, "api", "k", 1)
		if got := connect.CodeOf(err); got != connect.CodeDeadlineExceeded {
			t.Fatalf("error %v has code %v, want deadline_exceeded", err, got)
		}
	})
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		url string
		p   quotadclient.Protocol
	}{
		{"localhost:8080", quotadclient.ProtocolConnect},
		{"ftp://localhost:8080", quotadclient.ProtocolConnect},
		{"http://", quotadclient.ProtocolConnect},
		{"http://localhost:8080", quotadclient.Protocol(7)},
	} {
		if _, err := quotadclient.New(tc.url, quotadclient.Options{Protocol: tc.p}); !errors.Is(err, quotadclient.ErrInvalidOptions) {
			t.Errorf("New(%q, %v) = %v, want ErrInvalidOptions", tc.url, tc.p, err)
		}
	}
	for _, p := range protocols {
		if got, err := quotadclient.ParseProtocol(p.String()); err != nil || got != p {
			t.Errorf("ParseProtocol(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := quotadclient.ParseProtocol("http"); !errors.Is(err, quotadclient.ErrInvalidOptions) {
		t.Errorf("ParseProtocol(http) = %v", err)
	}
}
