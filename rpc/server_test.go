package rpc

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/node/store/redis"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// Test helpers: real nodes on real stores behind the real handler, served
// the way cmd/quotad serves it (HTTP/1 and h2c on one loopback port).

// testServer is one node behind NewHandler's handler on a loopback port.
type testServer struct {
	URL string
	// handler is NewHandler's handler, for tests that serve it differently.
	handler *Handler
	node    *node.Node
	health  *Health
	log     *syncBuffer
	// lastProto is the HTTP major version of the last request the HTTP
	// front end served, and httpRequests how many it served, so tests can
	// see which front end served a protocol.
	lastProto    atomic.Int32
	httpRequests atomic.Int64
}

// storeFactory makes a fresh store for one test.
type storeFactory func(t *testing.T) node.Store

// stores returns the stores every end-to-end test runs on: the embedded
// memory store, and Redis on a redis-server this test starts.
func stores() map[string]storeFactory {
	return map[string]storeFactory{
		"memory": func(*testing.T) node.Store { return memory.New(nil, 0) },
		"redis":  redisStore,
	}
}

func redisStore(t *testing.T) node.Store {
	t.Helper()
	return redisStoreOn(t, redistest.Start(t))
}

// redisStoreOn is a store on r, a redis-server the test controls.
func redisStoreOn(t *testing.T, r *redistest.Server) node.Store {
	t.Helper()
	s, err := redis.New(context.Background(), redis.Config{URL: r.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fiveAMinute is the demo limit: five units per fixed 60s window.
var fiveAMinute = algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: time.Minute}

// startServer starts a node on store with policies behind the handler.
func startServer(t *testing.T, store node.Store, cfg Config, policies ...node.Policy) *testServer {
	t.Helper()
	return startNodeServer(t, store, node.Config{Policies: policies}, cfg)
}

// memoryHandler is a Handler with the default Config over a node on the
// memory store with policies, closed when t ends.
func memoryHandler(t testing.TB, policies ...node.Policy) *Handler {
	t.Helper()
	n, err := node.New(node.Config{Policies: policies}, memory.New(nil, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	h, err := NewHandler(n, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// startNodeServer starts a node configured by ncfg on store behind the
// handler.
func startNodeServer(t *testing.T, store node.Store, ncfg node.Config, cfg Config) *testServer {
	t.Helper()
	n, err := node.New(ncfg, store, nil)
	if err != nil {
		store.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	ts := &testServer{node: n, health: NewHealth(n), log: &syncBuffer{}}
	cfg.Health = ts.health
	h, err := NewHandler(n, cfg, slogTo(ts.log))
	if err != nil {
		t.Fatal(err)
	}
	ts.handler = h
	ts.URL = serveAPI(t, h, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ts.lastProto.Store(int32(r.ProtoMajor))
		ts.httpRequests.Add(1)
		h.ServeHTTP(w, r)
	}))
	return ts
}

// serveAPI serves h on a fresh 127.0.0.1 port as cmd/quotad does, through
// NewServer: gRPC connections on grpc-go, the rest on an http.Server whose
// handler is httpHandler (h, or h wrapped). It returns the base URL; the
// server stops when the test ends.
func serveAPI(t testing.TB, h *Handler, httpHandler http.Handler) string {
	t.Helper()
	return serveAPIWith(t, h, httpHandler, ServerConfig{})
}

// serveAPIWith is serveAPI with the transport configured by cfg.
func serveAPIWith(t testing.TB, h *Handler, httpHandler http.Handler, cfg ServerConfig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(h, httpHandler, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln) // http.ErrServerClosed after Close
	}()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// serveH2C serves h alone on a fresh 127.0.0.1 port with NewServer's
// server, over HTTP/1.1 and cleartext HTTP/2, gRPC included (connect-go's),
// until the test ends: the HTTP front end without the gRPC one. It returns
// the base URL.
func serveH2C(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(nil, h, ServerConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln) // returns http.ErrServerClosed after Close
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// http1Client speaks HTTP/1.1 only: Connect, JSON and gRPC-Web.
func http1Client(t testing.TB) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// h2cClient speaks cleartext HTTP/2 with prior knowledge, as gRPC clients do.
func h2cClient(t testing.TB) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// client is the generated QuotaService client over protocol: "connect"
// (binary, HTTP/1.1), "grpc" (HTTP/2 cleartext) or "grpcweb" (HTTP/1.1).
func (ts *testServer) client(t testing.TB, protocol string) quotadv1connect.QuotaServiceClient {
	t.Helper()
	switch protocol {
	case "connect":
		return quotadv1connect.NewQuotaServiceClient(http1Client(t), ts.URL)
	case "grpc":
		return quotadv1connect.NewQuotaServiceClient(h2cClient(t), ts.URL, connect.WithGRPC())
	case "grpcweb":
		return quotadv1connect.NewQuotaServiceClient(http1Client(t), ts.URL, connect.WithGRPCWeb())
	}
	t.Fatalf("unknown protocol %q", protocol)
	return nil
}

// inProcessClient is a connect.HTTPClient that calls a handler directly,
// without a network: the whole handler (codecs, interceptors, recovery)
// runs, fast enough for fuzzing. It supports unary Connect calls only.
type inProcessClient struct {
	h http.Handler
}

func (c inProcessClient) Do(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// slogTo is a logger writing text to w.
func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, nil))
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
