package quotadclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/quotad/quotad/algorithms"
)

// TokenBudget is one limit of TokenMiddleware: the tokens of one kind
// (a model's input or output) a key may use.
type TokenBudget struct {
	// Policy is the quotad policy, or with Limit the inline limit's
	// namespace, and the name the RateLimit headers carry. Empty: no
	// budget of this kind.
	Policy string
	Limit  *algorithms.Limit
	// Estimate is the tokens a request reserves before it is served
	// (Client.Reserve), settled with the response's usage once it is
	// done. Required with Policy. An error answers 400 with its text.
	Estimate func(*http.Request) (int64, error)
}

// TokenMiddlewareConfig configures TokenMiddleware.
type TokenMiddlewareConfig struct {
	// Key picks the key of a request, as MiddlewareConfig.Key. Required.
	Key KeyFunc
	// Input and Output are the budgets of input and output tokens; at
	// least one must be set.
	Input, Output TokenBudget
	// Usage reads the tokens a response used from its body; ok false when
	// the body does not say. nil means OpenAIUsage.
	Usage func(body []byte) (input, output int64, ok bool)
	// MaxBody is how many bytes of a response body are kept to read its
	// usage from (the body itself goes to the client whole, as it is
	// written); 0 means 1 MiB. A response whose usage lies beyond it
	// settles at its estimates.
	MaxBody int
	// OnError, Timeout and Log are as MiddlewareConfig's: OnError applies
	// when a reservation gets no answer; Timeout bounds each reserve and
	// each settle.
	OnError ErrorMode
	Timeout time.Duration
	Log     *slog.Logger
}

func (cfg TokenMiddlewareConfig) validate() error {
	switch {
	case cfg.Key == nil:
		return errors.New("key: a KeyFunc is required (e.g. KeyByHeader(\"Authorization\"))")
	case cfg.Input.Policy == "" && cfg.Output.Policy == "":
		return errors.New("input, output: set at least one budget's Policy")
	case cfg.OnError != FailOpen && cfg.OnError != FailClosed:
		return fmt.Errorf("on error: %v is neither FailOpen nor FailClosed", cfg.OnError)
	case cfg.Timeout < 0:
		return fmt.Errorf("timeout: %v must not be negative", cfg.Timeout)
	case cfg.MaxBody < 0:
		return fmt.Errorf("max body: %d must not be negative", cfg.MaxBody)
	}
	for name, b := range map[string]TokenBudget{"input": cfg.Input, "output": cfg.Output} {
		if b.Policy == "" {
			continue
		}
		if b.Estimate == nil {
			return fmt.Errorf("%s: an Estimate is required with a Policy", name)
		}
		if b.Limit != nil {
			if err := b.Limit.Validate(); err != nil {
				return fmt.Errorf("%s limit: %w", name, err)
			}
		}
	}
	return nil
}

// TokenMiddleware returns middleware for a proxy in front of a model
// server, which learns a request's cost only from its response: for each
// budget it reserves the request's estimate before passing the request
// on, and once the response is done settles the reservation with the
// tokens the response's usage reports (Client.Reserve, Client.Settle), so
// that what a key is charged is what it used, input and output tokens
// each under its own limit:
//
//   - every budget's estimate fits: the request goes on, its response
//     carrying a RateLimit header per budget;
//   - one does not: 429 Too Many Requests with Retry-After, and the other
//     budgets' reservations are given back;
//   - a response whose usage cannot be read settles at the estimates (the
//     tokens stay charged);
//   - Key or Estimate failing, or quotad rejecting the input: 400;
//   - no answer from quotad: cfg.OnError (FailOpen serves the request
//     without reservations).
//
// A cost beyond the estimate is charged whether or not it fits, so a key
// that overspends is denied until its budget pays the debt back.
func TokenMiddleware(c *Client, cfg TokenMiddlewareConfig) (func(http.Handler) http.Handler, error) {
	if c == nil {
		return nil, errors.New("quotad token middleware: no client")
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("quotad token middleware: %w", err)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.Usage == nil {
		cfg.Usage = OpenAIUsage
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	m := &tokenLimiter{cfg: cfg, client: c}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

type tokenLimiter struct {
	cfg    TokenMiddlewareConfig
	client *Client
}

// held is one budget's reservation for a request.
type held struct {
	budget      TokenBudget
	output      bool // the output tokens' budget, else the input's
	estimate    int64
	reservation Reservation
}

func (m *tokenLimiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.cfg.Key(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var hs []held
	for i, b := range []TokenBudget{m.cfg.Input, m.cfg.Output} {
		if b.Policy == "" {
			continue
		}
		estimate, err := b.Estimate(r)
		if err != nil {
			m.giveBack(r, hs)
			http.Error(w, "token estimate: "+err.Error(), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), m.cfg.Timeout)
		d, rv, err := m.reserve(ctx, b, key, estimate)
		cancel()
		if err != nil {
			m.giveBack(r, hs)
			m.failed(w, r, next, b, err)
			return
		}
		w.Header().Add("RateLimit", limitItem(b.Policy, d, !d.Allowed && estimate > 0))
		if !d.Allowed && estimate > 0 {
			m.giveBack(r, hs)
			retry := retryAfterSeconds(d.RetryAfter)
			w.Header().Set("Retry-After", fmt.Sprint(retry))
			http.Error(w, fmt.Sprintf("token budget %s exceeded; retry in %ds", b.Policy, retry), http.StatusTooManyRequests)
			return
		}
		hs = append(hs, held{budget: b, output: i == 1, estimate: estimate, reservation: rv})
	}
	tee := &usageRecorder{ResponseWriter: w, max: m.cfg.MaxBody}
	next.ServeHTTP(tee, r)
	in, out, ok := m.cfg.Usage(tee.body.Bytes())
	if !ok || tee.truncated {
		m.cfg.Log.WarnContext(r.Context(), "quotad token middleware: no usage in the response; settled at the estimates", "status", tee.status)
	}
	for _, h := range hs {
		actual := h.estimate
		if ok && !tee.truncated {
			actual = in
			if h.output {
				actual = out
			}
		}
		m.settle(r, h.reservation, actual)
	}
}

func (m *tokenLimiter) reserve(ctx context.Context, b TokenBudget, key string, estimate int64) (Decision, Reservation, error) {
	if b.Limit != nil {
		return m.client.ReserveLimit(ctx, b.Policy, *b.Limit, key, estimate, 0)
	}
	return m.client.Reserve(ctx, b.Policy, key, estimate, 0)
}

// settle settles r with actual after the response, retrying once: a
// settle is safe to repeat. One that fails leaves the estimate charged.
func (m *tokenLimiter) settle(req *http.Request, r Reservation, actual int64) {
	var err error
	for range 2 {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), m.cfg.Timeout)
		_, err = m.client.Settle(ctx, r, actual)
		cancel()
		if err == nil || connect.CodeOf(err) == connect.CodeInvalidArgument {
			break
		}
	}
	if err != nil {
		m.cfg.Log.WarnContext(req.Context(), "quotad settle failed; the estimate stays charged", "policy", r.Policy, "code", connect.CodeOf(err).String(), "err", err)
	}
}

// giveBack settles the reservations already made for a request that will
// not be served with nothing used.
func (m *tokenLimiter) giveBack(r *http.Request, hs []held) {
	for _, h := range hs {
		m.settle(r, h.reservation, 0)
	}
}

// failed answers a request whose reservation in budget b returned err
// (failRequest).
func (m *tokenLimiter) failed(w http.ResponseWriter, r *http.Request, next http.Handler, b TokenBudget, err error) {
	failRequest(w, r, next, err, "token budget: ", m.cfg.OnError, func() {
		m.cfg.Log.WarnContext(r.Context(), "quotad reserve failed", "policy", b.Policy, "code", connect.CodeOf(err).String(), "on_error", m.cfg.OnError.String(), "err", err)
	})
}

// usageRecorder passes a response through and keeps up to max bytes of
// its body, to read the usage from.
type usageRecorder struct {
	http.ResponseWriter
	max       int
	body      bytes.Buffer
	truncated bool
	status    int
}

func (u *usageRecorder) WriteHeader(code int) {
	u.status = code
	u.ResponseWriter.WriteHeader(code)
}

func (u *usageRecorder) Write(p []byte) (int, error) {
	if room := u.max - u.body.Len(); room >= len(p) {
		u.body.Write(p)
	} else {
		u.body.Write(p[:max(room, 0)])
		u.truncated = true
	}
	return u.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the writer's Flush, so that
// a streamed response streams through.
func (u *usageRecorder) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// Flush passes a flush on, for handlers that assert http.Flusher.
func (u *usageRecorder) Flush() { _ = http.NewResponseController(u.ResponseWriter).Flush() }

// OpenAIUsage reads the usage of an OpenAI-compatible response: a JSON
// body's "usage" object with prompt_tokens and completion_tokens (Chat
// Completions) or input_tokens and output_tokens (Responses), or, for a
// server-sent event stream, the last "data:" event that carries one (sent
// with stream_options.include_usage).
func OpenAIUsage(body []byte) (input, output int64, ok bool) {
	if in, out, ok := usageOf(body); ok {
		return in, out, true
	}
	lines := bytes.Split(body, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		data, found := bytes.CutPrefix(bytes.TrimSpace(lines[i]), []byte("data:"))
		if !found {
			continue
		}
		if in, out, ok := usageOf(bytes.TrimSpace(data)); ok {
			return in, out, true
		}
	}
	return 0, 0, false
}

// usageOf reads one JSON object's usage.
func usageOf(doc []byte) (input, output int64, ok bool) {
	var v struct {
		Usage *struct {
			PromptTokens     *int64 `json:"prompt_tokens"`
			CompletionTokens *int64 `json:"completion_tokens"`
			InputTokens      *int64 `json:"input_tokens"`
			OutputTokens     *int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(doc, &v) != nil || v.Usage == nil {
		return 0, 0, false
	}
	u := v.Usage
	switch {
	case u.PromptTokens != nil && u.CompletionTokens != nil:
		return *u.PromptTokens, *u.CompletionTokens, true
	case u.InputTokens != nil && u.OutputTokens != nil:
		return *u.InputTokens, *u.OutputTokens, true
	}
	return 0, 0, false
}
