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

// ConcurrencyConfig configures ConcurrencyMiddleware.
type ConcurrencyConfig struct {
	// Policy is the quotad concurrency policy every request takes a slot
	// of, and the name the RateLimit headers carry. Required.
	Policy string
	// Limit, when set, is an inline concurrency limit in the namespace
	// Policy instead of a configured policy; its Algorithm must be
	// algorithms.Concurrency.
	Limit *algorithms.Limit
	// Key picks the key of a request (whose slots it takes); see
	// MiddlewareConfig.Key. A constant key (func(*http.Request) (string,
	// error) { return "all", nil }) bounds the handler as a whole.
	Key KeyFunc
	// OnError is what happens when no slot decision comes back; default
	// FailOpen (serve without a slot), as MiddlewareConfig.OnError.
	OnError ErrorMode
	// Timeout bounds each call to quotad: the acquire, every renew, the
	// release. Zero means DefaultTimeout; negative is invalid.
	Timeout time.Duration
	// RenewEvery is how often a slot is renewed while its request runs.
	// Zero means a third of the slot's lifetime (the limit's period, as
	// quotad reports it), so that two renews in a row may fail before the
	// slot expires under a request still running. Negative is invalid.
	RenewEvery time.Duration
	// Log receives a warning for every call that failed; nil discards.
	Log *slog.Logger
}

func (cfg ConcurrencyConfig) validate() error {
	if cfg.Limit != nil && cfg.Limit.Algorithm != algorithms.Concurrency {
		return fmt.Errorf("limit: %s is not a concurrency limit; use Middleware for rate limits", cfg.Limit.Algorithm)
	}
	if cfg.RenewEvery < 0 {
		return fmt.Errorf("renew every: %v must not be negative", cfg.RenewEvery)
	}
	return MiddlewareConfig{Policy: cfg.Policy, Limit: cfg.Limit, Key: cfg.Key, OnError: cfg.OnError, Timeout: cfg.Timeout}.validate()
}

// ConcurrencyMiddleware returns middleware that bounds how many requests
// per key are in flight at once, with a quotad concurrency limit shared by
// every instance of the program:
//
//   - before the next handler runs, it takes a slot (a check of cost 1);
//     when none is free it answers 429 Too Many Requests with Retry-After: 1
//     and the RateLimit headers, and the next handler is not called;
//   - while the handler runs it renews the slot every cfg.RenewEvery, so a
//     request may outlive the slot's period;
//   - when the handler returns — normally, by panicking (the panic goes on
//     to net/http), or early because the client went away — it stops
//     renewing and releases the slot. A process that dies holding slots
//     stops renewing them, and quotad frees them within their period.
//
// Key failing, or quotad rejecting the key as invalid, answers 400; no
// decision answers as cfg.OnError says (FailOpen serves the request
// without a slot). A slot that cannot be renewed any more (quotad says it
// is gone: renews failed for a whole period) is logged, and the request
// goes on without it.
//
// The headers follow draft-ietf-httpapi-ratelimit-headers-11 with its
// concurrent-requests quota unit: RateLimit-Policy:
// "jobs";q=10;qu="concurrent-requests" and RateLimit: "jobs";r=3, r being
// the slots free after this request took one. No w (a concurrency limit
// has no window) and no t: when a slot frees depends on requests still
// running. Retry-After on a denial is 1 second, the least it may say: a
// slot frees the moment any request ends, while quotad's retry_after is
// only when held slots would expire if nobody renewed them.
//
// The returned middleware is safe for concurrent use.
func ConcurrencyMiddleware(c *Client, cfg ConcurrencyConfig) (func(http.Handler) http.Handler, error) {
	if c == nil {
		return nil, errors.New("quotad concurrency middleware: no client")
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("quotad concurrency middleware: %w", err)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &concurrencyLimiter{
		limiter: &limiter{
			cfg:    MiddlewareConfig{Policy: cfg.Policy, Limit: cfg.Limit, Key: cfg.Key, OnError: cfg.OnError, Timeout: cfg.Timeout, Log: log},
			client: c,
			log:    log,
		},
		renewEvery: cfg.RenewEvery,
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

// concurrencyLimiter is one ConcurrencyMiddleware's state: a limiter (its
// check and failure handling) that holds slots.
type concurrencyLimiter struct {
	*limiter
	renewEvery time.Duration
}

func (m *concurrencyLimiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.cfg.Key(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// Not the request's context: a client that goes away while the slot
	// is being taken must not leave behind a slot nobody releases.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), m.cfg.Timeout)
	d, err := m.check(ctx, key, 1)
	cancel()
	if err != nil {
		m.failed(w, r, next, err)
		return
	}
	if d.Slot != "" {
		release := m.holdSlot(r, key, d, m.renewEvery)
		defer release()
	}
	if r.Context().Err() != nil {
		// The client went away while the slot was taken.
		return
	}
	h := w.Header()
	h.Add("RateLimit-Policy", concurrencyPolicyItem(m.cfg.Policy, d.Limit))
	h.Add("RateLimit", concurrencyLimitItem(m.cfg.Policy, d.Remaining))
	if !d.Allowed {
		h.Set("Retry-After", "1")
		http.Error(w, "concurrency limit reached; retry in 1s", http.StatusTooManyRequests)
		return
	}
	next.ServeHTTP(w, r)
}

// holdSlot keeps the slot d took for key alive, renewing it every
// renewEvery (0: a third of its lifetime), until the returned release is
// called, which stops renewing and frees the slot. Calls to quotad carry
// r's context's values but not its cancellation: a request whose client
// has gone still releases its slot.
func (m *limiter) holdSlot(r *http.Request, key string, d Decision, renewEvery time.Duration) (release func()) {
	ref := SlotRef{Policy: m.cfg.Policy, Limit: m.cfg.Limit, Key: key, ID: d.Slot}
	if renewEvery == 0 {
		renewEvery = max(d.SlotExpiresAfter/3, time.Millisecond)
	}
	base := context.WithoutCancel(r.Context())
	stop, stopped := make(chan struct{}), make(chan struct{})
	// lost is written before stopped closes and read after.
	lost := false
	go func() {
		defer close(stopped)
		t := time.NewTicker(renewEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(base, m.cfg.Timeout)
			_, err := m.client.RenewSlot(ctx, ref)
			cancel()
			switch {
			case err == nil:
			case connect.CodeOf(err) == connect.CodeNotFound:
				m.log.WarnContext(base, "quotad slot lost (not renewed within its period, or reset); the request goes on without it", "policy", m.cfg.Policy, "err", err)
				lost = true
				return
			default:
				// The slot lives on until its expiry; the next renew may
				// get through.
				m.log.WarnContext(base, "quotad slot renew failed", "policy", m.cfg.Policy, "code", connect.CodeOf(err).String(), "err", err)
			}
		}
	}()
	return func() {
		close(stop)
		<-stopped
		if lost {
			return
		}
		ctx, cancel := context.WithTimeout(base, m.cfg.Timeout)
		defer cancel()
		if _, err := m.client.ReleaseSlot(ctx, ref); err != nil {
			m.log.WarnContext(base, "quotad slot release failed; the slot frees itself when its period ends", "policy", m.cfg.Policy, "code", connect.CodeOf(err).String(), "err", err)
		}
	}
}
