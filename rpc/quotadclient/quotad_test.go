package quotadclient_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// Test helpers: a real quotad (node + rpc handler) on a loopback port,
// served like cmd/quotad serves it (HTTP/1.1 and h2c on one port).

// threeAMinute is the tests' configured policy "api".
var threeAMinute = node.Policy{
	Name:  "api",
	Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 3, Period: time.Minute},
}

// startQuotad serves a real node with policies and returns its base URL.
// The node's store is Redis on r, or the embedded memory store when r is
// nil.
func startQuotad(t *testing.T, r *redistest.Server, cfg rpc.Config, policies ...node.Policy) string {
	t.Helper()
	store := node.Store(memory.New(nil, 0))
	if r != nil {
		rs, err := redis.New(context.Background(), redis.Config{URL: r.URL(), Timeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		store = rs
	}
	n, err := node.New(node.Config{Policies: policies}, store, nil)
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h, err := rpc.NewHandler(n, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return serveH2C(t, h)
}

// serveH2C serves h over HTTP/1.1 and cleartext HTTP/2 (as cmd/quotad
// does) on a loopback port until the test ends.
func serveH2C(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// closedURL is the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return "http://127.0.0.1:" + strconv.Itoa(port)
}

// hangingURL is a server that accepts calls and never answers them (until
// the caller gives up or the test ends).
func hangingURL(t *testing.T) string {
	t.Helper()
	release := make(chan struct{})
	url := serveH2C(t, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	// Registered after serveH2C's cleanup, so it runs first and lets the
	// server close.
	t.Cleanup(func() { close(release) })
	return url
}

func newClient(t *testing.T, url string, p quotadclient.Protocol) *quotadclient.Client {
	t.Helper()
	c, err := quotadclient.New(url, quotadclient.Options{Protocol: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// logLines is a slog destination that hands each line (slog writes a
// record in one Write) to the test. The channel also orders the write
// before the test's read, which a shared buffer would need a lock for.
type logLines chan string

func (l logLines) Write(p []byte) (int, error) {
	l <- string(p)
	return len(p), nil
}

func (l logLines) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// next waits for the next line.
func (l logLines) next(t *testing.T) string {
	t.Helper()
	select {
	case line := <-l:
		return line
	case <-time.After(10 * time.Second):
		t.Fatal("nothing was logged within 10s")
		return ""
	}
}
