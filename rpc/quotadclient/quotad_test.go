package quotadclient_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
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

func memoryStore(*testing.T) node.Store { return node.NewMemoryStore(nil, 0) }

// redisStore is a Redis store on a redis-server of the test's own.
func redisStore(t *testing.T) node.Store {
	t.Helper()
	return redisStoreOn(t, redistest.Start(t))
}

func redisStoreOn(t *testing.T, r *redistest.Server) node.Store {
	t.Helper()
	s, err := node.NewRedisStore(context.Background(), node.RedisConfig{URL: r.URL(), Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startQuotad serves a node on store with policies and returns its base URL.
func startQuotad(t *testing.T, store node.Store, cfg rpc.Config, policies ...node.Policy) string {
	t.Helper()
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

// serveH2C serves h over HTTP/1.1 and cleartext HTTP/2 on a fresh loopback
// port until the test ends.
func serveH2C(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
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

// logBuffer is a slog destination safe for concurrent writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
