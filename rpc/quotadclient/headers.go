package quotadclient

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// The RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-11: each a Structured Fields list
// (RFC 9651) of items whose value is the policy name as an sf-string, with
// integer parameters. Only the parameters quotad can fill are written: q and
// w on the policy, r and t on the limit. The optional partition key (pk) is
// left out: it would echo the rate-limit key, which may be a credential.

// policyItem is one RateLimit-Policy item: the quota q (the most units the
// limit holds) and, when window is a positive whole number of seconds, the
// window w.
func policyItem(name string, quota int64, window time.Duration) string {
	var b strings.Builder
	b.WriteString(sfString(name))
	b.WriteString(";q=")
	b.WriteString(strconv.FormatInt(max(quota, 0), 10))
	if window > 0 && window%time.Second == 0 {
		b.WriteString(";w=")
		b.WriteString(strconv.FormatInt(int64(window/time.Second), 10))
	}
	return b.String()
}

// limitItem is one RateLimit item: the available quota r (units left) and
// the effective window t, the seconds until the quota is fully restored
// (ceilinged, as the field counts whole seconds). On a denial that sends
// Retry-After, t is capped at it: the draft asks that Retry-After never
// point earlier than the end of the effective window.
func limitItem(name string, d Decision, denied bool) string {
	t := ceilSeconds(d.ResetAfter)
	if denied {
		t = min(t, retryAfterSeconds(d.RetryAfter))
	}
	return sfString(name) + ";r=" + strconv.FormatInt(max(d.Remaining, 0), 10) + ";t=" + strconv.FormatInt(t, 10)
}

// concurrencyPolicyItem is one RateLimit-Policy item of a concurrency
// limit: the quota q in slots, with the draft's quota unit
// "concurrent-requests", and no window.
func concurrencyPolicyItem(name string, slots int64) string {
	return sfString(name) + ";q=" + strconv.FormatInt(max(slots, 0), 10) + `;qu="concurrent-requests"`
}

// concurrencyLimitItem is one RateLimit item of a concurrency limit: the
// free slots r. t (the seconds until the quota is restored) is left out, as
// the draft allows: it depends on when requests in flight end.
func concurrencyLimitItem(name string, free int64) string {
	return sfString(name) + ";r=" + strconv.FormatInt(max(free, 0), 10)
}

// retryAfterSeconds is the Retry-After value of a denial: whole seconds
// rounded up, and at least 1, since "retry after 0 seconds" would invite an
// immediate retry that is denied again.
func retryAfterSeconds(d time.Duration) int64 {
	return max(ceilSeconds(d), 1)
}

// ceilSeconds is d in whole seconds, rounded up; 0 for d ≤ 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// sfString serializes s as a Structured Fields string (RFC 9651 §4.1.6):
// quoted, with '"' and '\' escaped. quotad's policy names are
// [A-Za-z0-9_.-], so escaping never happens for a name quotad accepted;
// bytes an sf-string cannot hold (controls, non-ASCII) become '?' rather
// than a malformed header.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// windowRefresh is how often a middleware on a configured policy asks quotad
// for the policy's period again, so that a change in quotad's
// configuration reaches the headers.
const windowRefresh = time.Minute

// policyWindow is the w a middleware advertises. It is fixed when the
// configuration says it (Window, or an inline Limit's period); otherwise it
// is the configured policy's period, looked up with ListPolicies when first
// needed and then at most every windowRefresh, one lookup at a time. Safe
// for concurrent use.
type policyWindow struct {
	fixed  time.Duration // > 0: never looked up
	client *Client
	policy string

	mu       sync.Mutex
	current  time.Duration // 0 until a lookup finds the policy
	next     time.Time     // no lookup before this
	inflight bool
}

func newPolicyWindow(c *Client, cfg MiddlewareConfig) *policyWindow {
	w := &policyWindow{client: c, policy: cfg.Policy, fixed: cfg.Window}
	if w.fixed == 0 && cfg.Limit != nil {
		w.fixed = cfg.Limit.Period
	}
	return w
}

// get returns the window to advertise, 0 for none. It may call quotad,
// bounded by ctx; while another request's lookup is in flight, or a failed
// one is younger than windowRefresh, it returns what is known without
// waiting.
func (w *policyWindow) get(ctx context.Context) time.Duration {
	if w.fixed > 0 {
		return w.fixed
	}
	w.mu.Lock()
	if w.inflight || time.Now().Before(w.next) {
		cur := w.current
		w.mu.Unlock()
		return cur
	}
	w.inflight = true
	w.mu.Unlock()

	period, err := w.lookup(ctx)

	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight = false
	w.next = time.Now().Add(windowRefresh)
	if err == nil {
		// A policy quotad no longer lists yields 0: no w rather than a
		// stale one.
		w.current = period
	}
	return w.current
}

// lookup asks quotad for the configured policy's period; 0 when quotad does
// not list the policy.
func (w *policyWindow) lookup(ctx context.Context) (time.Duration, error) {
	res, err := w.client.svc.ListPolicies(ctx, connect.NewRequest(&quotadv1.ListPoliciesRequest{}))
	if err != nil {
		return 0, err
	}
	for _, p := range res.Msg.GetPolicies() {
		if p.GetName() == w.policy {
			return p.GetLimit().GetPeriod().AsDuration(), nil
		}
	}
	return 0, nil
}
