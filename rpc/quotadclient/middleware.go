package quotadclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
)

// ErrorMode says what the middleware does with a request when it gets no
// decision from quotad: quotad unreachable, too slow, or answering with an
// error other than InvalidArgument.
type ErrorMode int

const (
	// FailOpen serves the request, without RateLimit headers (nothing is
	// known about the quota), and logs the error. The zero value and so the
	// default, as in quotad's own store failure mode and Envoy's rate limit
	// filter: an outage of the limiter must not take the API down with it.
	FailOpen ErrorMode = iota
	// FailClosed answers 503 Service Unavailable and logs the error. For
	// APIs where unlimited traffic is worse than none (expensive or
	// abusable endpoints).
	FailClosed
)

// String returns "open" or "closed".
func (m ErrorMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return fmt.Sprintf("ErrorMode(%d)", int(m))
}

// DefaultTimeout bounds each check the middleware makes when
// MiddlewareConfig.Timeout is zero. It is above quotad's default Redis
// deadline (50ms), so that quotad's own failure-mode answer to a slow store
// arrives before the middleware gives up.
const DefaultTimeout = 250 * time.Millisecond

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Policy is the quotad policy every request is checked against, and the
	// name the RateLimit headers carry. Required.
	Policy string
	// Limit, when set, is checked as an inline limit in the namespace
	// Policy instead of a configured policy (see Client.CheckLimit).
	Limit *algorithms.Limit
	// Key picks the key of a request (whom the limit counts). Required; see
	// KeyByHeader, KeyByIP, KeyByRoute and KeyJoin. An error answers 400
	// Bad Request with the error's text, so key functions should return
	// messages fit for the client, as this package's do.
	Key KeyFunc
	// Cost is the units a request spends; nil means 1. Cost 0 makes a
	// request free: it is never denied, spends nothing, and still carries
	// the RateLimit headers (from a cost-0 check). An error answers 400
	// with the error's text, like Key's; a negative cost, or one above the
	// limit's capacity, comes back from quotad as InvalidArgument and also
	// answers 400.
	Cost func(*http.Request) (int64, error)
	// OnError is what happens when no decision comes back; default
	// FailOpen. A key or cost that quotad rejects as invalid answers 400
	// whatever OnError says, so that an oversized key cannot be used to
	// slip past a failing-open limiter.
	OnError ErrorMode
	// Timeout bounds each check (within the request's own deadline).
	// Zero means DefaultTimeout; negative is invalid.
	Timeout time.Duration
	// Window is the time window the RateLimit-Policy header advertises as
	// w; whole seconds, as the header has no finer unit. Zero means: Limit's period when
	// Limit is set, otherwise the configured policy's period, which the
	// middleware asks quotad for (ListPolicies) with the first decision
	// and then at most once a minute. A period that is not whole seconds,
	// or a policy quotad does not list, leaves w out (it is optional).
	// Negative or fractional seconds are invalid.
	Window time.Duration
	// Log receives a warning for every check that failed, so that a
	// limiter failing open does not go unnoticed; nil means
	// slog.Default() at the time Middleware is called. To discard the
	// warnings, pass slog.New(slog.DiscardHandler).
	Log *slog.Logger
}

// validate checks cfg before any request is served, so that a
// misconfiguration fails at startup rather than on every request.
func (cfg MiddlewareConfig) validate() error {
	switch {
	case cfg.Policy == "":
		return errors.New("policy: must not be empty")
	case cfg.Key == nil:
		return errors.New("key: a KeyFunc is required (e.g. KeyByIP())")
	case cfg.OnError != FailOpen && cfg.OnError != FailClosed:
		return fmt.Errorf("on error: %v is neither FailOpen nor FailClosed", cfg.OnError)
	case cfg.Timeout < 0:
		return fmt.Errorf("timeout: %v must not be negative", cfg.Timeout)
	case cfg.Window < 0 || cfg.Window%time.Second != 0:
		return fmt.Errorf("window: %v must be zero or a positive whole number of seconds", cfg.Window)
	}
	if cfg.Limit != nil {
		if err := cfg.Limit.Validate(); err != nil {
			return fmt.Errorf("limit: %w", err)
		}
	}
	return nil
}

// Middleware returns middleware that checks every request with quotad
// before passing it on:
//
//   - allowed: the request goes to the next handler, its response carrying
//     RateLimit-Policy and RateLimit headers;
//   - denied: 429 Too Many Requests with Retry-After (whole seconds, rounded
//     up), the RateLimit headers and a one-line text body; the next handler
//     is not called;
//   - Key or Cost failing, or quotad rejecting the key or cost as invalid:
//     400 Bad Request;
//   - no decision (quotad unreachable, timeout, other errors): cfg.OnError.
//
// The headers follow draft-ietf-httpapi-ratelimit-headers-11 (May 2026; its
// syntax is unchanged since -09): RateLimit-Policy: "api";q=100;w=60 and
// RateLimit: "api";r=37;t=12. Chained middlewares add one list item each.
// The returned middleware is safe for concurrent use.
func Middleware(c *Client, cfg MiddlewareConfig) (func(http.Handler) http.Handler, error) {
	if c == nil {
		return nil, errors.New("quotad middleware: no client")
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("quotad middleware: %w", err)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	m := &limiter{cfg: cfg, client: c, log: log, window: newPolicyWindow(c, cfg)}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

// limiter is one Middleware's state.
type limiter struct {
	cfg    MiddlewareConfig
	client *Client
	log    *slog.Logger
	window *policyWindow
}

func (m *limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.cfg.Key(r)
	if err != nil {
		// This package's key errors read "no rate-limit key: ...".
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cost := int64(1)
	if m.cfg.Cost != nil {
		if cost, err = m.cfg.Cost(r); err != nil {
			http.Error(w, "rate limit cost: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), m.cfg.Timeout)
	defer cancel()
	d, err := m.check(ctx, key, cost)
	if err != nil {
		m.failed(w, r, next, err)
		return
	}
	deny := !d.Allowed && cost > 0
	h := w.Header()
	h.Add("RateLimit-Policy", policyItem(m.cfg.Policy, d.Limit, m.window.get(ctx)))
	h.Add("RateLimit", limitItem(m.cfg.Policy, d, deny))
	if deny {
		retry := retryAfterSeconds(d.RetryAfter)
		h.Set("Retry-After", fmt.Sprint(retry))
		http.Error(w, fmt.Sprintf("rate limit exceeded; retry in %ds", retry), http.StatusTooManyRequests)
		return
	}
	if d.Slot != "" {
		// Policy is a concurrency limit: hold its slot while the handler
		// runs, as ConcurrencyMiddleware does, rather than leave it held
		// for a whole period.
		defer m.holdSlot(r, key, d, 0)()
	}
	next.ServeHTTP(w, r)
}

func (m *limiter) check(ctx context.Context, key string, cost int64) (Decision, error) {
	if m.cfg.Limit != nil {
		return m.client.CheckLimit(ctx, m.cfg.Policy, *m.cfg.Limit, key, cost)
	}
	return m.client.Check(ctx, m.cfg.Policy, key, cost)
}

// failed answers a request whose check returned err (failRequest).
func (m *limiter) failed(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	failRequest(w, r, next, err, "rate limit: ", m.cfg.OnError, func() {
		m.log.WarnContext(r.Context(), "quotad check failed", "policy", m.cfg.Policy, "code", connect.CodeOf(err).String(), "on_error", m.cfg.OnError.String(), "err", err)
	})
}

// failRequest answers a request whose call to quotad returned err, as
// every middleware here does. A client that has gone gets nothing: nobody
// reads an answer, and a failure of quotad is not what happened. A request
// quotad found invalid gets 400 with quotad's message after prefix: it
// names the field ("key: ... exceeds 1024"), is about the request and is
// safe to show, whatever onError says, so that an invalid request cannot
// be used to pass. Any other failure is logged with warn, then fails
// closed (503) or open (next serves the request) as onError says.
func failRequest(w http.ResponseWriter, r *http.Request, next http.Handler, err error, prefix string, onError ErrorMode, warn func()) {
	if r.Context().Err() != nil {
		return
	}
	var ce *connect.Error
	if errors.As(err, &ce) && ce.Code() == connect.CodeInvalidArgument {
		http.Error(w, prefix+ce.Message(), http.StatusBadRequest)
		return
	}
	warn()
	if onError == FailClosed {
		http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
		return
	}
	next.ServeHTTP(w, r)
}
