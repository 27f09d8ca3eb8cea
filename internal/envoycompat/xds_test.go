package envoycompat

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quotad/quotad/internal/testpki"
)

// managementServer is go-control-plane's own xDS server (server/v3 over a
// snapshot cache) on a loopback port, recording the requests it gets.
type managementServer struct {
	t     *testing.T
	cache cachev3.SnapshotCache
	grpc  *grpc.Server
	addr  string
	// node is the node id set serves; "edge-node" unless changed.
	node string

	mu       sync.Mutex
	requests []*discoveryv3.DiscoveryRequest
}

// serveManagement starts a management server on addr ("127.0.0.1:0" for
// any port), with cache as its state, and the server options opts (e.g.
// TLS).
func serveManagement(t *testing.T, addr string, cache cachev3.SnapshotCache, opts ...grpc.ServerOption) *managementServer {
	t.Helper()
	m := &managementServer{t: t, cache: cache, node: "edge-node"}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.requests = append(m.requests, r)
		return nil
	}}
	srv := serverv3.NewServer(context.Background(), cache, cb)
	m.grpc = grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(m.grpc, srv)
	var ln net.Listener
	var err error
	for try := 0; try < 50; try++ { // a port just let go may take a moment to bind again
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	m.addr = ln.Addr().String()
	go func() { _ = m.grpc.Serve(ln) }()
	t.Cleanup(m.grpc.Stop)
	return m
}

// set makes version, with rules, the snapshot of node m.node.
func (m *managementServer) set(version string, rules ...*rlsconfv3.RateLimitConfig) {
	m.t.Helper()
	res := make([]types.Resource, len(rules))
	for i, r := range rules {
		res[i] = r
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.cache.SetSnapshot(context.Background(), m.node, snap); err != nil {
		m.t.Fatal(err)
	}
}

// acked reports whether quotad acknowledged version (a request naming it
// with a nonce), and nacked whether it refused a response while holding
// version (a request with a nonce and version_info still version, after
// the newer one was sent).
func (m *managementServer) acked(version string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.requests {
		if r.GetResponseNonce() != "" && r.GetVersionInfo() == version {
			return true
		}
	}
	return false
}

func (m *managementServer) requestsSeen() []*discoveryv3.DiscoveryRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), m.requests...)
}

// edgeRules is the domain "edge" with a limit of perMinute a minute on
// each user.
func edgeRules(perMinute uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "edge", Domain: "edge", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute, Name: "per-user"},
	}}}
}

// The rules come from go-control-plane's own management server, state of
// the world, as Envoy Gateway serves them to envoyproxy/ratelimit: they
// apply once sent, an update replaces them, an update that does not
// compile is refused (NACK) and the rules in force stay, and while the
// management server is away quotad keeps serving the last good rules and
// takes the next ones when it is back.
func TestRulesFromAnXDSManagementServer(t *testing.T) {
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	m := serveManagement(t, "127.0.0.1:0", cache)
	m.set("1", edgeRules(2))
	addr, stderr := runQuotad(t, "--envoy-xds-server", m.addr, "--envoy-xds-node-id", "edge-node")
	c := dial(t, addr)
	limitOf := func(user string) uint32 {
		return c.call("edge", 1, desc("user", user)).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	eventually(t, 10*time.Second, "version 1's rules in force", func() bool { return limitOf("probe-1") == 2 })
	c.want("the second hit", c.call("edge", 1, desc("user", "alice")).GetStatuses()[0], ok, limit{2, minute, "per-user"}, 1)
	c.call("edge", 1, desc("user", "alice"))
	c.want("the third hit", c.call("edge", 1, desc("user", "alice")).GetStatuses()[0], over, limit{2, minute, "per-user"}, 0)
	if !m.acked("1") {
		t.Errorf("version 1 was never acknowledged; requests: %v", m.requestsSeen())
	}

	// An update replaces the rules.
	m.set("2", edgeRules(5))
	eventually(t, 10*time.Second, "version 2's rules in force", func() bool { return limitOf("probe-2") == 5 })
	eventually(t, 5*time.Second, "version 2 acknowledged", func() bool { return m.acked("2") })

	// A rule that cannot be served (a rate limit without a unit) is
	// refused: the management server hears version 2 again with version
	// 3's nonce, and the rules in force stay.
	broken := edgeRules(7)
	broken.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	m.set("3", broken)
	eventually(t, 10*time.Second, "version 3 refused", func() bool {
		return strings.Contains(stderr.String(), "rules refused") && strings.Contains(stderr.String(), "version=3")
	})
	if m.acked("3") {
		t.Error("version 3 was acknowledged, want refused")
	}
	if got := limitOf("probe-3"); got != 5 {
		t.Errorf("after a refused update the limit is %d, want version 2's 5", got)
	}
	nacks := 0
	for _, r := range m.requestsSeen() {
		if r.GetResponseNonce() != "" && r.GetVersionInfo() == "2" {
			nacks++
		}
	}
	if nacks < 2 { // the ACK of version 2, then the NACK of version 3
		t.Errorf("%d requests holding version 2 with a nonce, want its ACK and version 3's NACK", nacks)
	}

	// The management server goes away: the rules in force stay.
	m.grpc.Stop()
	time.Sleep(500 * time.Millisecond)
	if got := limitOf("probe-4"); got != 5 {
		t.Errorf("with the management server away the limit is %d, want version 2's 5", got)
	}
	// It comes back on the same address with new rules: quotad dials
	// again (every 3s, with jitter) and takes them.
	back := serveManagement(t, m.addr, cache)
	back.set("4", edgeRules(9))
	eventually(t, 15*time.Second, "version 4's rules in force after the management server came back", func() bool { return limitOf("probe-5") == 9 })
	if !strings.Contains(stderr.String(), "the rules in force stay, dialing again") {
		t.Errorf("quotad did not say it kept its rules while the management server was away:\n%s", stderr.String())
	}
}

// minute is the unit of edgeRules's limits, as answered.
const minute = rlsv3.RateLimitResponse_RateLimit_MINUTE

// Over TLS, with a client certificate: quotad checks the management
// server's certificate against --envoy-xds-tls-ca-file and presents its
// own, which the server requires.
func TestRulesFromAnXDSManagementServerOverTLS(t *testing.T) {
	ca := testpki.NewCA(t, "xds CA")
	server, client := ca.Issue(t, "xds", true), ca.Issue(t, "quotad", false)
	tc := &tls.Config{Certificates: []tls.Certificate{server.Pair}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	m := serveManagement(t, "127.0.0.1:0", cache, grpc.Creds(credentials.NewTLS(tc)))
	m.set("1", edgeRules(4))
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	addr, stderr := runQuotad(t, "--envoy-xds-server", m.addr, "--envoy-xds-node-id", "edge-node",
		"--envoy-xds-tls", "--envoy-xds-tls-ca-file", write("ca.crt", ca.PEM),
		"--envoy-xds-tls-cert-file", write("quotad.crt", client.CertPEM), "--envoy-xds-tls-key-file", write("quotad.key", client.KeyPEM),
		"--envoy-xds-tls-server-name", "localhost")
	c := dial(t, addr)
	eventually(t, 10*time.Second, "the rules from the TLS management server in force", func() bool {
		return c.call("edge", 1, desc("user", "probe")).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 4
	})
	if !m.acked("1") {
		t.Errorf("version 1 was never acknowledged over TLS:\n%s", stderr.String())
	}
}
