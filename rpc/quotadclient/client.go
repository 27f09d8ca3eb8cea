// Package quotadclient is a Go client for quotad, and net/http middleware
// that rate-limits a handler with it (Middleware) or bounds how many
// requests it serves at once (ConcurrencyMiddleware).
//
// The client is a thin layer over the generated Connect client
// (quotadv1connect): it picks the protocol and HTTP transport, turns
// responses into plain Go values and leaves errors' Connect codes intact
// (connect.CodeOf works on every error it returns). Service exposes the
// generated client for the RPCs this package does not wrap.
//
// The package imports connect, the generated API and package algorithms
// only, so using it does not pull quotad's server (Redis, memberlist) into a
// program.
package quotadclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
	"github.com/quotad/quotad/rpc/protoconv"
)

// ErrInvalidOptions is wrapped by every error New returns for bad arguments.
var ErrInvalidOptions = errors.New("invalid quotad client options")

// Protocol selects the wire protocol. quotad serves all three on one port.
type Protocol int

const (
	// ProtocolConnect is the Connect protocol with binary protobuf, over
	// HTTP/1.1 (or HTTP/2 when the URL is https and the server offers it).
	// The zero value: it passes through any HTTP proxy.
	ProtocolConnect Protocol = iota
	// ProtocolGRPC is gRPC. It needs HTTP/2: cleartext HTTP/2 with prior
	// knowledge (h2c) for http:// URLs, HTTP/2 over TLS for https:// ones.
	ProtocolGRPC
	// ProtocolGRPCWeb is gRPC-Web over HTTP/1.1.
	ProtocolGRPCWeb
)

// String returns "connect", "grpc" or "grpcweb".
func (p Protocol) String() string {
	switch p {
	case ProtocolConnect:
		return "connect"
	case ProtocolGRPC:
		return "grpc"
	case ProtocolGRPCWeb:
		return "grpcweb"
	}
	return fmt.Sprintf("Protocol(%d)", int(p))
}

// ParseProtocol is the inverse of String.
func ParseProtocol(s string) (Protocol, error) {
	for _, p := range []Protocol{ProtocolConnect, ProtocolGRPC, ProtocolGRPCWeb} {
		if p.String() == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: protocol %q (want connect, grpc or grpcweb)", ErrInvalidOptions, s)
}

// Options configures New. The zero value speaks Connect over a transport of
// the client's own.
type Options struct {
	// Protocol is the wire protocol; default ProtocolConnect.
	Protocol Protocol
	// HTTPClient carries the calls. Nil means a transport made for
	// Protocol (h2c for gRPC over http://), owned by the Client and closed
	// by Close. A caller's client must speak HTTP/2 for ProtocolGRPC.
	// Per-call deadlines come from the context, so it needs no Timeout.
	HTTPClient *http.Client
	// ClientOptions are passed to the generated client after the protocol
	// option, e.g. connect.WithInterceptors for tracing.
	ClientOptions []connect.ClientOption
	// TLSConfig configures TLS for https:// URLs on the transport New
	// makes: RootCAs to trust a private CA, Certificates for a quotad that
	// requires client certificates (--tls-client-ca-file). Nil means the
	// system's roots and no client certificate. It must be nil when
	// HTTPClient is set (configure that client's transport instead).
	TLSConfig *tls.Config
	// AdminToken, when not empty, is sent with every call as
	// "Authorization: Bearer <token>", as quotad requires for admin calls
	// (Reset) when it has --admin-token-file. Give it only to clients that
	// need it, and prefer https:// URLs: the header is a credential.
	AdminToken string
	// Local, when set, turns on local mode: checks of keys that are hot in
	// this process are answered from client-side leases, remembered
	// denials answer until their retry_after, and other checks go to
	// quotad batched (see LocalOptions and the README's "Local mode").
	// Close then returns the leases' unused units. Nil: every check is a
	// Check call.
	Local *LocalOptions
}

// Client calls one quotad address (a node, or a load balancer in front of
// several). It is safe for concurrent use.
type Client struct {
	svc quotadv1connect.QuotaServiceClient
	// own is the transport New made, closed by Close; nil when the caller
	// supplied the HTTP client.
	own *http.Transport
	// local is local mode; nil when off.
	local *local
}

// New returns a client of the quotad at baseURL, e.g.
// "http://localhost:8080". It does no I/O.
func New(baseURL string, opts Options) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("%w: base URL: %v", ErrInvalidOptions, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%w: base URL %q: want http://host:port or https://host:port", ErrInvalidOptions, baseURL)
	}
	var protocolOption []connect.ClientOption
	switch opts.Protocol {
	case ProtocolConnect:
	case ProtocolGRPC:
		protocolOption = append(protocolOption, connect.WithGRPC())
	case ProtocolGRPCWeb:
		protocolOption = append(protocolOption, connect.WithGRPCWeb())
	default:
		return nil, fmt.Errorf("%w: protocol %v", ErrInvalidOptions, opts.Protocol)
	}
	if opts.TLSConfig != nil && opts.HTTPClient != nil {
		return nil, fmt.Errorf("%w: TLSConfig with HTTPClient (set TLS on that client's transport)", ErrInvalidOptions)
	}
	if opts.AdminToken != "" {
		if strings.ContainsFunc(opts.AdminToken, func(r rune) bool { return r <= ' ' || r > '~' }) {
			return nil, fmt.Errorf("%w: admin token: only printable ASCII without spaces may go in an Authorization header", ErrInvalidOptions)
		}
		protocolOption = append(protocolOption, connect.WithInterceptors(bearer(opts.AdminToken)))
	}
	if opts.Local != nil {
		if err := opts.Local.validate(); err != nil {
			return nil, err
		}
	}
	c := &Client{}
	hc := opts.HTTPClient
	if hc == nil {
		c.own = newTransport(opts.Protocol, opts.TLSConfig)
		hc = &http.Client{Transport: c.own}
	}
	c.svc = quotadv1connect.NewQuotaServiceClient(hc, strings.TrimSuffix(baseURL, "/"), append(protocolOption, opts.ClientOptions...)...)
	if opts.Local != nil {
		c.local = newLocal(c.svc, opts.Local.withDefaults())
	}
	return c, nil
}

// newTransport is http.DefaultTransport's settings (proxy from the
// environment, dial and TLS timeouts) adjusted for p, with tc (may be nil)
// for TLS.
func newTransport(p Protocol, tc *tls.Config) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if tc != nil {
		t.TLSClientConfig = tc.Clone()
	}
	// Over HTTP/1.1 each concurrent call needs a connection of its own;
	// the default of 2 idle connections per host would make a busy
	// middleware open and close connections all the time.
	t.MaxIdleConnsPerHost = 64
	if p == ProtocolGRPC {
		// gRPC is HTTP/2 only. Without HTTP1 in the set, http:// URLs use
		// cleartext HTTP/2 with prior knowledge, as quotad serves it.
		t.Protocols = new(http.Protocols)
		t.Protocols.SetHTTP2(true)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return t
}

// Close ends local mode, if on: every lease stops being spent and its
// unused units go back to quotad (Close waits for that, at most
// returnTimeout); checks should have stopped. Then it releases the idle
// connections of the transport New made. It does nothing to an HTTP
// client the caller supplied. Calls after Close still work (they open new
// connections; in local mode, leases taken then are not returned).
func (c *Client) Close() error {
	var err error
	if c.local != nil {
		ctx, cancel := context.WithTimeout(context.Background(), returnTimeout)
		err = c.local.close(ctx)
		cancel()
	}
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
	return err
}

// Reset clears key's state of policy (a configured policy or an inline
// limit's namespace) at quotad's authority, and every node's lease and
// cached denial of it. It is an admin call: a quotad with an admin token
// refuses it with Unauthenticated unless Options.AdminToken is set, and
// with PermissionDenied if that token is not quotad's. It blocks until
// quotad answers or ctx ends.
func (c *Client) Reset(ctx context.Context, policy, key string) error {
	if _, err := c.svc.Reset(ctx, connect.NewRequest(&quotadv1.ResetRequest{Policy: policy, Key: key})); err != nil {
		return fmt.Errorf("reset of policy %q: %w", policy, err)
	}
	return nil
}

// bearer sets the Authorization header of every call to token.
func bearer(token string) connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, req)
		}
	})
}

// Service is the generated client, for the RPCs this package does not wrap
// (CheckBatch, ListPolicies).
func (c *Client) Service() quotadv1connect.QuotaServiceClient { return c.svc }

// Source says which part of quotad made a decision: "store", "lease",
// "denied_cache", "fail_open" or "fail_closed" (quotad's store failed and
// the policy's failure mode decided); in local mode also "client_lease" and
// "client_denied_cache" (decided in this process). A source this package
// does not know (a newer server) is quotad's enum name or number in lower
// case.
type Source string

// The sources quotad reports.
const (
	SourceStore       Source = "store"
	SourceLease       Source = "lease"
	SourceDeniedCache Source = "denied_cache"
	SourceFailOpen    Source = "fail_open"
	SourceFailClosed  Source = "fail_closed"
)

// Decision is quotad's answer to one check; a denial is a Decision with
// Allowed false, not an error. The embedded algorithms.Decision carries
// Allowed, Limit, Remaining, ResetAfter and RetryAfter (whole milliseconds,
// as quotad reports them).
type Decision struct {
	algorithms.Decision
	// Source says who decided.
	Source Source
	// Slot is the id of the slot an allowed check of cost 1 took on a
	// concurrency limit (renew it with RenewSlot, free it with
	// ReleaseSlot); "" otherwise, and when quotad's store failed and the
	// policy failed open. SlotExpiresAfter is how long it lives unless
	// renewed.
	Slot             string
	SlotExpiresAfter time.Duration
}

// Check asks quotad whether key may spend cost units of the configured
// policy now, and spends them if so. Cost 0 spends nothing and reports
// whether one unit would be admitted. Invalid input comes back as an error
// with code InvalidArgument (quotad validates; this client does not), an
// unknown policy as NotFound, an unreachable quotad as Unavailable (or the
// context's DeadlineExceeded/Canceled). It blocks until quotad answers or
// ctx ends.
//
// In local mode (Options.Local) a check answered in this process blocks
// on nothing and allocates nothing; Source then says SourceClientLease or
// SourceClientDeniedCache.
func (c *Client) Check(ctx context.Context, policy, key string, cost int64) (Decision, error) {
	if c.local != nil {
		return c.local.check(ctx, leaseKey{policy: policy, key: key}, false, cost)
	}
	return c.check(ctx, policy, key, cost, nil)
}

// CheckLimit is Check with an inline limit instead of a configured policy:
// namespace separates its keys from other limits' (it must not be the name
// of a configured policy), and the server's default failure mode applies.
// The server must allow inline limits (quotad --inline-limits, the default);
// otherwise the error's code is PermissionDenied.
func (c *Client) CheckLimit(ctx context.Context, namespace string, limit algorithms.Limit, key string, cost int64) (Decision, error) {
	if c.local != nil {
		return c.local.check(ctx, leaseKey{policy: namespace, key: key, limit: limit}, true, cost)
	}
	return c.check(ctx, namespace, key, cost, limitToProto(limit))
}

// limitToProto is an inline limit as the API sends it.
func limitToProto(limit algorithms.Limit) *quotadv1.Limit {
	return &quotadv1.Limit{
		Algorithm: protoconv.AlgorithmToProto(limit.Algorithm),
		Limit:     limit.Limit,
		Period:    durationpb.New(limit.Period),
		Burst:     limit.Burst,
	}
}

// check is one Check call. (cost is a parameter of its own so that the
// pointer taken here does not make Check's cost escape on local hits.)
func (c *Client) check(ctx context.Context, policy, key string, cost int64, limit *quotadv1.Limit) (Decision, error) {
	req := &quotadv1.CheckRequest{Policy: policy, Key: key, Cost: &cost, Limit: limit}
	res, err := c.svc.Check(ctx, connect.NewRequest(req))
	if err != nil {
		// The key is left out: it may be a credential (an API key).
		return Decision{}, fmt.Errorf("check of policy %q: %w", req.GetPolicy(), err)
	}
	return decisionFromProto(res.Msg), nil
}

// decisionFromProto is a response as a Decision.
func decisionFromProto(m *quotadv1.CheckResponse) Decision {
	return Decision{
		Decision: algorithms.Decision{
			Allowed:    m.GetAllowed(),
			Limit:      m.GetLimit(),
			Remaining:  m.GetRemaining(),
			ResetAfter: m.GetResetAfter().AsDuration(),
			RetryAfter: m.GetRetryAfter().AsDuration(),
		},
		Source:           sourceFromProto(m.GetSource()),
		Slot:             m.GetSlotId(),
		SlotExpiresAfter: m.GetSlotExpiresAfter().AsDuration(),
	}
}

// sourceFromProto goes through the names: the API's Source names are
// Source's values upper-cased with a prefix (SOURCE_DENIED_CACHE is
// denied_cache). Algorithms map through rpc/protoconv, as the
// server's do.
func sourceFromProto(s quotadv1.Source) Source {
	return Source(strings.ToLower(strings.TrimPrefix(s.String(), "SOURCE_")))
}
