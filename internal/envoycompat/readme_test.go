package envoycompat

import (
	"context"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/prototext"

	"github.com/quotad/quotad/internal/quotadtest"
)

// The configuration examples of envoyproxy/ratelimit's README ("Examples"
// 1 to 11), as files in testdata/readme, unchanged, served by a quotad binary
// started with --envoy-config-dir alone, and called by go-control-plane's
// client over grpc-go: the decisions are the ones that README describes.
//
// Limits per second would make "the eleventh request is over" depend on
// the clock. The tests instead spend what is left of a limit with one
// request's hits_addend and then ask for one more hit: over the limit,
// unless a new window began in between, which the answer shows (something
// is left again) and which drive then simply repeats.

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// rls is a stock client of one quotad.
type rls struct {
	t      *testing.T
	addr   string
	client rlsv3.RateLimitServiceClient
}

func dial(t *testing.T, addr string) *rls {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &rls{t: t, addr: addr, client: rlsv3.NewRateLimitServiceClient(conn)}
}

// call sends one request of hits to domain with the descriptors ds.
func (c *rls) call(domain string, hits uint32, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds})
	if err != nil {
		c.t.Fatalf("ShouldRateLimit(%s, %v): %v", domain, ds, err)
	}
	if len(res.GetStatuses()) != len(ds) {
		c.t.Fatalf("%d statuses for %d descriptors", len(res.GetStatuses()), len(ds))
	}
	return res
}

// limit is a status's expected current_limit; the zero value means none.
type limit struct {
	perUnit uint32
	unit    rlsv3.RateLimitResponse_RateLimit_Unit
	name    string
}

// want checks one status: its code, current_limit and limit_remaining
// (remaining < 0: any).
func (c *rls) want(what string, st *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, l limit, remaining int64) {
	c.t.Helper()
	text := prototext.Format(st)
	if st.GetCode() != code {
		c.t.Errorf("%s: code %s, want %s (%s)", what, st.GetCode(), code, text)
	}
	if remaining >= 0 && int64(st.GetLimitRemaining()) != remaining {
		c.t.Errorf("%s: limit_remaining %d, want %d (%s)", what, st.GetLimitRemaining(), remaining, text)
	}
	cl := st.GetCurrentLimit()
	if l == (limit{}) {
		if cl != nil || st.GetDurationUntilReset() != nil {
			c.t.Errorf("%s: want no current_limit nor duration_until_reset (%s)", what, text)
		}
		return
	}
	if cl.GetRequestsPerUnit() != l.perUnit || cl.GetUnit() != l.unit || cl.GetName() != l.name || cl.GetUnitMultiplier() != nil {
		c.t.Errorf("%s: current_limit %s, want %d per %s named %q (%s)", what, prototext.Format(cl), l.perUnit, l.unit, l.name, text)
	}
	if d := st.GetDurationUntilReset(); d == nil || d.AsDuration() < 0 || d.AsDuration() > 24*time.Hour {
		c.t.Errorf("%s: duration_until_reset %v, want up to a day (%s)", what, d, text)
	}
}

// drive spends what is left of the limit the descriptor at index i of ds
// counts in (left, as known), then asks for one more hit, until that hit
// finds nothing left: over the limit (answered OVER_LIMIT, or OK in shadow
// mode, which the caller checks). It returns that answer. A window that
// ends in between shows as something left after the spending or the extra
// hit, and drive spends that too.
func (c *rls) drive(domain string, left uint32, i int, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	c.t.Helper()
	for try := 0; try < 10; try++ {
		if left > 0 {
			res := c.call(domain, left, ds...)
			st := res.GetStatuses()[i]
			if st.GetCode() != ok {
				c.t.Fatalf("spending the %d hits left: %s", left, prototext.Format(res))
			}
			if left = st.GetLimitRemaining(); left > 0 {
				continue
			}
		}
		res := c.call(domain, 1, ds...)
		if left = res.GetStatuses()[i].GetLimitRemaining(); left == 0 {
			return res
		}
	}
	c.t.Fatalf("%s %v: never over the limit in one window in 10 tries", domain, ds)
	return nil
}

func desc(kv ...string) *commonv3.RateLimitDescriptor { return descriptor(kv...) }

// metrics returns quotad's /metrics text.
func (c *rls) metrics() string {
	c.t.Helper()
	resp, err := http.Get("http://" + c.addr + "/metrics")
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return string(body)
}

// metric finds the value of the series of name whose labels include all of
// labels ("k=v"), in the Prometheus text body; -1 when there is none.
func metric(body, name string, labels ...string) float64 {
	for _, line := range strings.Split(body, "\n") {
		var set, value string
		if v, found := strings.CutPrefix(line, name+" "); found {
			value = v
		} else if rest, found := strings.CutPrefix(line, name+"{"); found {
			if set, value, found = strings.Cut(rest, "} "); !found {
				continue
			}
		} else {
			continue
		}
		matched := true
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if !strings.Contains(","+set+",", ","+k+"="+strconv.Quote(v)+",") {
				matched = false
				break
			}
		}
		if matched {
			f, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return -1
			}
			return f
		}
	}
	return -1
}

func TestREADMEExamples(t *testing.T) {
	addr, _ := runQuotad(t, "--envoy-config-dir", filepath.Join("testdata", "readme"))
	c := dial(t, addr)
	sec := func(n uint32) limit { return limit{n, rlsv3.RateLimitResponse_RateLimit_SECOND, ""} }

	t.Run("1: two values of one key, 500 a second each", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		c.want("users, first", c.call("mongo_cps", 1, desc("database", "users")).GetStatuses()[0], ok, sec(500), 499)
		res := c.drive("mongo_cps", 499, 0, desc("database", "users"))
		c.want("users, one past 500", res.GetStatuses()[0], over, sec(500), 0)
		if res.GetOverallCode() != over {
			t.Errorf("overall_code %s, want OVER_LIMIT", res.GetOverallCode())
		}
		c.want("default: a counter of its own", c.call("mongo_cps", 1, desc("database", "default")).GetStatuses()[0], ok, sec(500), 499)
		c.want("another value: no rule", c.call("mongo_cps", 1, desc("database", "orders")).GetStatuses()[0], ok, limit{}, 0)
	})

	t.Run("2: nested descriptors, several per request", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		day := func(n uint32) limit { return limit{n, rlsv3.RateLimitResponse_RateLimit_DAY, ""} }
		marketing := func(number string) *commonv3.RateLimitDescriptor {
			return desc("message_type", "marketing", "to_number", number)
		}
		res := c.call("messaging", 1, marketing("2061111111"), desc("to_number", "2061111111"))
		c.want("marketing to 2061111111", res.GetStatuses()[0], ok, day(5), 4)
		c.want("any message to 2061111111", res.GetStatuses()[1], ok, day(100), 99)
		res = c.call("messaging", 4, marketing("2061111111"), desc("to_number", "2061111111"))
		c.want("marketing, fifth", res.GetStatuses()[0], ok, day(5), 0)
		res = c.call("messaging", 1, marketing("2061111111"), desc("to_number", "2061111111"))
		if res.GetOverallCode() != over {
			t.Errorf("sixth marketing message: overall_code %s, want OVER_LIMIT (the logical OR)", res.GetOverallCode())
		}
		c.want("marketing, sixth", res.GetStatuses()[0], over, day(5), 0)
		c.want("any message, sixth", res.GetStatuses()[1], ok, day(100), 94)
		c.want("marketing to another number", c.call("messaging", 1, marketing("2062222222")).GetStatuses()[0], ok, day(5), 4)
	})

	t.Run("3: the most specific match; requests_per_unit 0 blocks", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		c.want("50.0.0.1, first", c.call("edge_proxy_per_ip", 1, desc("remote_address", "50.0.0.1")).GetStatuses()[0], ok, sec(10), 9)
		c.want("50.0.0.1, eleventh in a second", c.drive("edge_proxy_per_ip", 9, 0, desc("remote_address", "50.0.0.1")).GetStatuses()[0], over, sec(10), 0)
		c.want("50.0.0.2: its own counter", c.call("edge_proxy_per_ip", 1, desc("remote_address", "50.0.0.2")).GetStatuses()[0], ok, sec(10), 9)
		c.want("50.0.0.5: black-listed", c.call("edge_proxy_per_ip", 1, desc("remote_address", "50.0.0.5")).GetStatuses()[0], over, sec(0), 0)
	})

	t.Run("4: a descriptor matches rules of its own depth", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		two := desc("key", "value", "subkey", "subvalue")
		c.want("two entries, nested rule", c.call("example4", 1, two).GetStatuses()[0], ok, sec(300), 299)
		c.want("one entry, nesting-only rule", c.call("example4", 1, desc("key", "value")).GetStatuses()[0], ok, limit{}, 0)
		// The README's first configuration, whose rule is one level deep.
		firstAddr, _ := runQuotad(t, "--envoy-config-dir", filepath.Join("testdata", "readme-example4-first"))
		first := dial(t, firstAddr)
		first.want("two entries, one-level rule", first.call("example4", 1, two).GetStatuses()[0], ok, limit{}, 0)
		first.want("one entry, one-level rule", first.call("example4", 1, desc("key", "value")).GetStatuses()[0], ok, sec(300), 299)
	})

	t.Run("5: unlimited", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		c.want("ldap", c.call("internal", 1000, desc("ldap", "cn=admin")).GetStatuses()[0], ok, limit{}, math.MaxUint32)
		c.want("azure", c.call("internal", 1, desc("azure", "tenant-1")).GetStatuses()[0], ok, limit{100, rlsv3.RateLimitResponse_RateLimit_MINUTE, ""}, 99)
	})

	t.Run("6: shadow_mode answers OK and still counts", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		userA := desc("service", "auth-service", "user", "user-a")
		res := c.drive("example6", 10, 0, userA)
		c.want("user-a, past 10 a second", res.GetStatuses()[0], ok, sec(10), 0)
		if res.GetOverallCode() != ok {
			t.Errorf("user-a: overall_code %s, want OK", res.GetOverallCode())
		}
		res = c.drive("example6", 20, 0, desc("service", "auth-service", "user", "user-b"))
		c.want("user-b, past 20 a second", res.GetStatuses()[0], over, sec(20), 0)
		m := c.metrics()
		for _, name := range []string{"quotad_envoy_over_limit_total", "quotad_envoy_shadow_mode_total"} {
			if v := metric(m, name, "quotad_envoy_domain=example6", "quotad_envoy_rule=service.user_user-a"); v < 1 {
				t.Errorf("%s for user-a = %g, want at least 1", name, v)
			}
		}
	})

	t.Run("7: replaces", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		one, two := desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")
		res := c.call("example7", 1, one, two)
		c.want("replaced", res.GetStatuses()[0], ok, limit{}, 0)
		c.want("replacing", res.GetStatuses()[1], ok, sec(10), 9)
		res = c.drive("example7", 9, 1, one, two)
		c.want("replacing, past 10 a second", res.GetStatuses()[1], over, sec(10), 0)
		c.want("replaced, still not decided", res.GetStatuses()[0], ok, limit{}, 0)
		// Alone, the named limit applies, and was never spent by the
		// requests above.
		c.want("alone", c.call("example7", 1, one).GetStatuses()[0], ok, limit{5, rlsv3.RateLimitResponse_RateLimit_SECOND, "specific_limit"}, 4)
	})

	t.Run("8: detailed_metric", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		minute := func(n uint32) limit { return limit{n, rlsv3.RateLimitResponse_RateLimit_MINUTE, ""} }
		c.want("unspecified_value", c.call("example8", 1, desc("key1", "unspecified_value")).GetStatuses()[0], ok, minute(10), 9)
		c.want("unspecified_value2", c.call("example8", 1, desc("key1", "unspecified_value2")).GetStatuses()[0], ok, minute(10), 9)
		c.want("value1", c.call("example8", 1, desc("key1", "value1")).GetStatuses()[0], ok, minute(20), 19)
		m := c.metrics()
		for _, series := range [][]string{
			{"quotad_envoy_rule=key1", "quotad_envoy_detail=key1_unspecified_value"},
			{"quotad_envoy_rule=key1", "quotad_envoy_detail=key1_unspecified_value2"},
			{"quotad_envoy_rule=key1_value1"},
		} {
			if v := metric(m, "quotad_envoy_hits_total", append(series, "quotad_envoy_domain=example8")...); v != 1 {
				t.Errorf("quotad_envoy_hits_total%v = %g, want 1", series, v)
			}
		}
	})

	t.Run("9: value wildcards", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		minute := limit{20, rlsv3.RateLimitResponse_RateLimit_MINUTE, ""}
		c.want("value_1", c.call("example9", 1, desc("key1", "value_1")).GetStatuses()[0], ok, minute, 19)
		c.want("value_2: its own counter", c.call("example9", 1, desc("key1", "value_2")).GetStatuses()[0], ok, minute, 19)
		c.want("another value", c.call("example9", 1, desc("key1", "other")).GetStatuses()[0], ok, limit{}, 0)
	})

	t.Run("10: value_to_metric", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		c.call("example10", 1, desc("route", "api", "http_method", "GET", "subject_id", "123"))
		c.call("example10", 1, desc("route", "web", "http_method", "POST", "subject_id", "456"))
		c.call("example10_wildcard", 1, desc("user", "alice", "action", "readfile", "resource", "documents"))
		m := c.metrics()
		for domain, detail := range map[string]string{
			"example10":          "route_api.http_method_GET.subject_id",
			"example10_wildcard": "user_alice.action_readfile.resource",
		} {
			if v := metric(m, "quotad_envoy_hits_total", "quotad_envoy_domain="+domain, "quotad_envoy_detail="+detail); v != 1 {
				t.Errorf("%s: hits named %s: %v, want 1", domain, detail, v)
			}
		}
		if v := metric(m, "quotad_envoy_hits_total", "quotad_envoy_domain=example10", "quotad_envoy_detail=route_web.http_method_POST.subject_id"); v != 1 {
			t.Errorf("example10: hits named route_web.http_method_POST.subject_id: %v, want 1", v)
		}
	})

	t.Run("11: share_threshold", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		// Hourly windows: the calls must not straddle an hour's end.
		quotadtest.AwayFromWindowEnd(t, time.Hour, 10*time.Second)
		hour := limit{10, rlsv3.RateLimitResponse_RateLimit_HOUR, ""}
		c.want("5 for files/a.pdf", c.call("example11", 5, desc("files", "files/a.pdf")).GetStatuses()[0], ok, hour, 5)
		c.want("5 for files/b.csv, the same counter", c.call("example11", 5, desc("files", "files/b.csv")).GetStatuses()[0], ok, hour, 0)
		c.want("files/c.txt, over the shared limit", c.call("example11", 1, desc("files", "files/c.txt")).GetStatuses()[0], over, hour, 0)
		c.want("10 for files_no_share/a.pdf", c.call("example11", 10, desc("files_no_share", "files_no_share/a.pdf")).GetStatuses()[0], ok, hour, 0)
		c.want("files_no_share/b.csv, a counter of its own", c.call("example11", 1, desc("files_no_share", "files_no_share/b.csv")).GetStatuses()[0], ok, hour, 9)
		// The pattern names a share_threshold rule's statistics, as
		// envoyproxy/ratelimit's config tests expect (route_api/*.method;
		// its README's text says route_api.method_GET, which its code does
		// not produce).
		c.call("example11_metrics", 1, desc("route", "api/v1", "method", "GET"))
		if v := metric(c.metrics(), "quotad_envoy_hits_total", "quotad_envoy_domain=example11_metrics", "quotad_envoy_detail=route_api/*.method"); v != 1 {
			t.Errorf("example11_metrics: hits named route_api/*.method: %v, want 1", v)
		}
	})

	t.Run("a domain in no file", func(t *testing.T) {
		c := &rls{t: t, addr: c.addr, client: c.client}
		c.want("unknown domain", c.call("nowhere", 1, desc("database", "users")).GetStatuses()[0], ok, limit{}, 0)
	})
}

// --envoy-shadow-mode, like SHADOW_MODE: overall OK, the statuses as
// decided.
func TestGlobalShadowMode(t *testing.T) {
	dir := t.TempDir()
	raw, err := os.ReadFile(filepath.Join("testdata", "readme", "example3.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "example3.yaml"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := runQuotad(t, "--envoy-config-dir", dir, "--envoy-shadow-mode")
	c := dial(t, addr)
	res := c.call("edge_proxy_per_ip", 1, desc("remote_address", "50.0.0.5"), desc("remote_address", "50.0.0.1"))
	if res.GetOverallCode() != ok {
		t.Errorf("overall_code %s, want OK", res.GetOverallCode())
	}
	c.want("black-listed", res.GetStatuses()[0], over, limit{0, rlsv3.RateLimitResponse_RateLimit_SECOND, ""}, 0)
	c.want("another address", res.GetStatuses()[1], ok, limit{10, rlsv3.RateLimitResponse_RateLimit_SECOND, ""}, 9)
	if v := metric(c.metrics(), "quotad_envoy_global_shadow_mode_total"); v != 1 {
		t.Errorf("quotad_envoy_global_shadow_mode_total = %g, want 1", v)
	}
}
