package envoy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// Rules of envoyproxy/ratelimit's schema (Domain.File set): what its
// config files say, as cmd/quotad hands them over.

func rpu(n uint32) *uint32 { return &n }

// perUnit is a rate_limit block of n requests per unit.
func perUnit(n uint32, unit string) *RateLimit {
	return &RateLimit{Unit: unit, RequestsPerUnit: rpu(n)}
}

func fileDomain(file, domain string, ds ...Descriptor) Domain {
	return Domain{Domain: domain, File: file, Descriptors: ds}
}

// Every mistake in a file is refused, naming the file, the line and the
// descriptor path.
func TestFileRulesValidate(t *testing.T) {
	policies := append(matchPolicies(), node.Policy{Name: "huge", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: math.MaxUint32 + 1, Period: time.Minute}})
	nested := func(d Descriptor) Config {
		return Config{Domains: []Domain{fileDomain("a.yaml", "edge",
			Descriptor{Key: "ok", RateLimit: perUnit(1, "second")},
			Descriptor{Key: "parent", Line: 5, Descriptors: []Descriptor{d}})}}
	}
	for _, tc := range []struct {
		name          string
		cfg           Config
		want          string
		unknownPolicy bool
	}{
		{"empty domain", Config{Domains: []Domain{fileDomain("a.yaml", "")}}, "a.yaml: domain: invalid envoy config: must not be empty", false},
		{"domain in two files", Config{Domains: []Domain{fileDomain("a.yaml", "edge"), fileDomain("b.yaml", "edge")}},
			`b.yaml: domain: invalid envoy config: "edge" is configured twice (also in a.yaml)`, false},
		{"domain in the config file and a file", Config{Domains: []Domain{
			{Domain: "edge", Descriptors: []Descriptor{{Key: "k", Policy: "per-ip"}}}, fileDomain("b.yaml", "edge"),
		}}, `b.yaml: domain: invalid envoy config: "edge" is configured twice (also in envoy.domains[0] of the config file)`, false},
		{"empty key", nested(Descriptor{Line: 7, RateLimit: perUnit(1, "second")}),
			"a.yaml: line 7: descriptors[1].descriptors[0].key: invalid envoy config: must not be empty", false},
		{"bad unit", nested(Descriptor{Key: "k", Line: 7, RateLimit: perUnit(1, "fortnight")}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.unit: invalid envoy config: "fortnight" is not a unit: write second, minute, hour, day, week, month or year`, false},
		{"missing unit", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{RequestsPerUnit: rpu(3)}}),
			`rate_limit.unit: invalid envoy config: "" is not a unit`, false},
		{"unlimited with a unit", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Unlimited: true, Unit: "second"}}),
			"a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.unit: invalid envoy config: an unlimited rate limit takes no unit", false},
		{"empty replaces", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: rpu(1), Replaces: []string{"x", ""}}}),
			"line 7: descriptors[1].descriptors[0].rate_limit.replaces[1].name: invalid envoy config: a replaced limit needs a name", false},
		{"replaces itself", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: rpu(1), Name: "n", Replaces: []string{"n"}}}),
			`rate_limit.replaces[0].name: invalid envoy config: limit "n" cannot replace itself`, false},
		{"quotad_policy with a unit", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Policy: "login", Unit: "second"}}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit: invalid envoy config: quotad_policy "login" says how to limit; it excludes unit, requests_per_unit and unlimited`, false},
		{"quotad_policy with requests_per_unit 0", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Policy: "login", RequestsPerUnit: rpu(0)}}),
			`it excludes unit, requests_per_unit and unlimited`, false},
		{"unknown quotad_policy", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Policy: "nope"}}),
			`a.yaml: line 7: descriptors[1].descriptors[0].rate_limit.quotad_policy: invalid envoy config: unknown policy "nope"`, true},
		{"quotad_policy too large for Envoy", nested(Descriptor{Key: "k", Line: 7, RateLimit: &RateLimit{Policy: "huge"}}),
			`rate_limit.quotad_policy: invalid envoy config: policy "huge": limit 4294967296 (burst 0) exceeds 4294967295`, false},
		{"duplicate value", nested(Descriptor{Key: "k", Value: "v", Line: 7, Descriptors: []Descriptor{
			{Key: "x", Value: "1", Line: 8}, {Key: "x", Value: "1", Line: 9},
		}}), "a.yaml: line 9: descriptors[1].descriptors[0].descriptors[1]: invalid envoy config: a rule for x=1 comes twice at this level", false},
		{"duplicate wildcard", nested(Descriptor{Key: "k", Value: "v", Line: 7, Descriptors: []Descriptor{
			{Key: "x", Value: "a*", Line: 8}, {Key: "x", Value: "b*", Line: 9}, {Key: "x", Value: "a*", Line: 10},
		}}), "line 10: descriptors[1].descriptors[0].descriptors[2]: invalid envoy config: a rule for x=a* comes twice at this level", false},
		{"duplicate default", nested(Descriptor{Key: "k", Value: "v", Line: 7, Descriptors: []Descriptor{
			{Key: "x", Line: 8}, {Key: "x", Line: 9},
		}}), `line 9: descriptors[1].descriptors[0].descriptors[1]: invalid envoy config: a rule for key "x" with no value comes twice`, false},
		{"quotad's fields in a file", nested(Descriptor{Key: "k", Line: 7, Policy: "login"}),
			"a.yaml: line 7: descriptors[1].descriptors[0]: invalid envoy config: policy and unlimited belong to quotad's config file", false},
		{"a file's fields in quotad's schema", one("edge", Descriptor{Key: "k", RateLimit: perUnit(1, "second")}),
			"envoy.domains[0].descriptors[0].rate_limit: invalid envoy config: rate_limit belongs to envoyproxy/ratelimit's files", false},
		{"near limit ratio", Config{NearLimitRatio: 1.5}, "envoy near limit ratio: invalid envoy config: 1.5 is not in (0, 1]", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate(policies)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want an error containing %q", err, tc.want)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Validate: %v does not wrap ErrInvalidConfig", err)
			}
			if got := errors.Is(err, node.ErrUnknownPolicy); got != tc.unknownPolicy {
				t.Errorf("Validate: errors.Is(%v, node.ErrUnknownPolicy) = %t, want %t", err, got, tc.unknownPolicy)
			}
		})
	}

	// What envoyproxy/ratelimit accepts, quotad accepts: an empty domain
	// (no descriptors), a rule that limits nothing, shadow_mode and
	// detailed_metric anywhere, requests_per_unit left out, units in any
	// case, replaces naming limits that do not exist.
	ok := Config{Domains: []Domain{
		fileDomain("empty.yaml", "empty"),
		fileDomain("a.yaml", "edge",
			Descriptor{Key: "whitelisted", Value: "x", ShadowMode: true, DetailedMetric: true},
			Descriptor{Key: "blocked", RateLimit: &RateLimit{Unit: "Second"}},
			Descriptor{Key: "weekly", RateLimit: perUnit(7, "WEEK")},
			Descriptor{Key: "yearly", RateLimit: perUnit(7, "year")},
			Descriptor{Key: "r", RateLimit: &RateLimit{Unit: "day", RequestsPerUnit: rpu(1), Replaces: []string{"nobody"}}},
			Descriptor{Key: "free", RateLimit: &RateLimit{Unlimited: true, Name: "free", RequestsPerUnit: rpu(5)}},
			Descriptor{Key: "bucket", RateLimit: &RateLimit{Policy: "login", Name: "named"}},
		),
	}}
	if err := ok.Validate(policies); err != nil {
		t.Fatalf("valid files refused: %v", err)
	}
}

// Value wildcards: exact values first, then the first wildcard written
// that matches, then the key's default; a '*' in the middle is a wildcard
// too; a rule without rate_limit applies and limits nothing.
func TestFileMatch(t *testing.T) {
	named := func(n string) *RateLimit {
		return &RateLimit{Unit: "minute", RequestsPerUnit: rpu(1), Name: n}
	}
	table, err := compileTable(Config{Domains: []Domain{fileDomain("a.yaml", "edge",
		Descriptor{Key: "path", Value: "/api/v1", RateLimit: named("exact")},
		Descriptor{Key: "path", Value: "/api/v1*", RateLimit: named("v1-prefix")},
		Descriptor{Key: "path", Value: "/api/*", RateLimit: named("api-prefix")},
		Descriptor{Key: "path", Value: "/api/v1/x*", RateLimit: named("shadowed-by-earlier")},
		Descriptor{Key: "path", RateLimit: named("default")},
		Descriptor{Key: "user", Value: "*", RateLimit: named("any-user"), Descriptors: []Descriptor{
			{Key: "tier", Value: "gold*", RateLimit: named("gold")},
		}},
		Descriptor{Key: "literal", Value: "a*b", RateLimit: named("literal")},
		Descriptor{Key: "free", Value: "yes"},
	)}}, lookupIn(nil))
	if err != nil {
		t.Fatal(err)
	}
	edge := table.domains["edge"]
	for _, tc := range []struct {
		entries []entry
		want    string // the rule's name; "" none; "(whitelisted)" a rule without a limit
	}{
		{entries("path", "/api/v1"), "exact"},
		{entries("path", "/api/v1/x/y"), "v1-prefix"},
		{entries("path", "/api/v2"), "api-prefix"},
		{entries("path", "/api/"), "api-prefix"},
		// A wildcard's own text is its rule's, before any wildcard.
		{entries("path", "/api/v1/x*"), "shadowed-by-earlier"},
		{entries("path", "/home"), "default"},
		{entries("user", "alice"), "any-user"},
		{entries("user", "alice", "tier", "gold-plus"), "gold"},
		{entries("user", "alice", "tier", "silver"), ""},
		{entries("literal", "a*b"), "literal"},
		{entries("literal", "axb"), "literal"},
		{entries("literal", "ab"), "literal"},
		{entries("literal", "abc"), ""},
		{entries("free", "yes"), "(whitelisted)"},
		{entries("free", "no"), ""},
	} {
		r := edge.match(tc.entries)
		got := ""
		if r != nil {
			got = r.name
		}
		if tc.want == "(whitelisted)" {
			// A rule that limits nothing is found, and has no limit.
			if n := edge.find(tc.entries[0]); n == nil || n.rule != nil {
				t.Errorf("%v: node %+v, want a rule without a limit", tc.entries, n)
			}
			tc.want = ""
		}
		if got != tc.want {
			t.Errorf("match(%v) = %q, want %q", tc.entries, got, tc.want)
		}
	}
}

// maxDescriptors is what rpc allows a request by default (its MaxBatch).
const maxDescriptors = 1000

// fileService serves the rules cfg, compiled against policies, on the
// memory store, with metrics read by the returned reader.
func fileService(t *testing.T, cfg Config, policies ...node.Policy) (*Service, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return newService(t, memory.New(nil, 0), NewSwitch(compiled(t, cfg, policies...)), maxDescriptors, mp, policies...), reader
}

func request(domain string, ds ...*rlscommonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// envoyCounts reads the quotad.* counters: name → "domain/rule[/detail]" → value.
func envoyCounts(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if !strings.HasPrefix(m.Name, "quotad.envoy.") {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("%s is %T, want a sum", m.Name, m.Data)
			}
			name := strings.TrimPrefix(m.Name, "quotad.envoy.")
			out[name] = map[string]int64{}
			for _, p := range sum.DataPoints {
				var parts []string
				for _, k := range []string{"quotad.envoy.domain", "quotad.envoy.rule", "quotad.envoy.detail"} {
					if v, ok := p.Attributes.Value(attribute.Key(k)); ok {
						parts = append(parts, v.AsString())
					}
				}
				out[name][strings.Join(parts, "/")] = p.Value
			}
		}
	}
	return out
}

// Blocked rules (requests_per_unit 0), named limits, units and shadow mode
// as envoyproxy/ratelimit answers them, with its statistics.
func TestFileDecisions(t *testing.T) {
	c, reader := fileService(t, Config{Domains: []Domain{fileDomain("edge.yaml", "edge",
		// Years, so that no window ends while the test runs.
		Descriptor{Key: "remote_address", RateLimit: perUnit(10, "year")},
		Descriptor{Key: "remote_address", Value: "50.0.0.5", RateLimit: &RateLimit{Unit: "second", RequestsPerUnit: rpu(0), Name: "banned"}},
		Descriptor{Key: "weekly", RateLimit: &RateLimit{Unit: "week", RequestsPerUnit: rpu(2), Name: "per-week"}},
		Descriptor{Key: "beta", ShadowMode: true, RateLimit: perUnit(1, "year")},
		Descriptor{Key: "tenant", DetailedMetric: true, RateLimit: perUnit(1, "minute")},
		Descriptor{Key: "bucket", RateLimit: &RateLimit{Policy: "bucket"}},
		Descriptor{Key: "free", RateLimit: &RateLimit{Unlimited: true}},
	)}}, edgePolicies()...)

	// Ten a year: hits within; the last two past the near-limit ratio
	// (0.8 × 10 = 8); then over.
	for i := 1; i <= 11; i++ {
		res := shouldRateLimit(t, c, request("edge", desc("remote_address", "192.0.2.1")))
		st := res.GetStatuses()[0]
		want, remaining := codeOK, uint32(10-i)
		if i == 11 {
			want, remaining = codeOver, 0
		}
		if st.GetCode() != want || st.GetLimitRemaining() != remaining || res.GetOverallCode() != want {
			t.Fatalf("request %d: %v, want %s remaining %d", i, res, want, remaining)
		}
		if cl := st.GetCurrentLimit(); cl.GetName() != "" || cl.GetRequestsPerUnit() != 10 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_YEAR || cl.GetUnitMultiplier() != nil {
			t.Fatalf("request %d: current_limit %v, want 10 per YEAR, unnamed", i, cl)
		}
		if d := st.GetDurationUntilReset().AsDuration(); d <= 0 || d > 365*24*time.Hour {
			t.Fatalf("request %d: duration_until_reset %s, want (0, 365d]", i, d)
		}
	}

	// requests_per_unit 0: always over, without a counter; the reset is
	// the end of the current second.
	res := shouldRateLimit(t, c, request("edge", desc("remote_address", "50.0.0.5")))
	wantStatus(t, "blocked", res.GetStatuses()[0], codeOver, "banned", 0, "SECOND", 0, 0)
	if d := res.GetStatuses()[0].GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Second {
		t.Errorf("blocked: duration_until_reset %s, want (0, 1s]", d)
	}

	res = shouldRateLimit(t, c, request("edge", desc("weekly", "w")))
	if cl := res.GetStatuses()[0].GetCurrentLimit(); cl.GetName() != "per-week" || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_WEEK || cl.GetRequestsPerUnit() != 2 {
		t.Errorf("weekly: current_limit %v, want per-week, 2 per WEEK", cl)
	}

	// Shadow mode: OK, and counted as over the limit and shadowed.
	for i := 0; i < 3; i++ {
		res = shouldRateLimit(t, c, request("edge", desc("beta", "on")))
		if res.GetOverallCode() != codeOK || res.GetStatuses()[0].GetCode() != codeOK {
			t.Fatalf("shadow request %d: %v, want OK", i, res)
		}
	}

	// quotad_policy: the policy's algorithm and limit, named after it.
	res = shouldRateLimit(t, c, request("edge", desc("bucket", "b")))
	wantStatus(t, "quotad_policy", res.GetStatuses()[0], codeOK, "bucket", 2, "SECOND", 30, 3)

	res = shouldRateLimit(t, c, request("edge", withHits(desc("free", "x"), 7)))
	wantStatus(t, "unlimited", res.GetStatuses()[0], codeOK, "", 0, "", 0, math.MaxUint32)

	// detailed_metric: each value its own label, up to the cap.
	for i := 0; i < maxDetails+5; i++ {
		shouldRateLimit(t, c, request("edge", desc("tenant", fmt.Sprint("t", i))))
	}

	got := envoyCounts(t, reader)
	for _, w := range []struct {
		metric, series string
		want           int64
	}{
		{"hits", "edge/remote_address", 11},
		{"within_limit", "edge/remote_address", 10},
		{"near_limit", "edge/remote_address", 2},
		{"over_limit", "edge/remote_address", 1},
		{"hits", "edge/remote_address_50.0.0.5", 1},
		{"over_limit", "edge/remote_address_50.0.0.5", 1},
		{"hits", "edge/beta", 3},
		{"within_limit", "edge/beta", 1},
		{"near_limit", "edge/beta", 1},
		{"over_limit", "edge/beta", 2},
		{"shadow_mode", "edge/beta", 2},
		{"hits", "edge/free", 7},
		{"hits", "edge/tenant/tenant_t0", 1},
		{"hits", "edge/tenant/tenant_t99", 1},
		{"hits", "edge/tenant/(other)", 5},
	} {
		if v := got[w.metric][w.series]; v != w.want {
			t.Errorf("%s{%s} = %d, want %d", w.metric, w.series, v, w.want)
		}
	}
	// Six rules, and the detailed one's capped details.
	if n, want := len(got["hits"]), 6+maxDetails+1; n != want {
		t.Errorf("%d hits series, want %d: %v", n, want, got["hits"])
	}
}

// replaces: when one request's descriptors match a limit and one that
// replaces it, only the replacing one is decided and counted.
func TestFileReplaces(t *testing.T) {
	c, reader := fileService(t, Config{Domains: []Domain{fileDomain("r.yaml", "example7",
		Descriptor{Key: "key_1", Value: "value_1", Descriptors: []Descriptor{
			{Key: "user", Value: "bkthomps", RateLimit: &RateLimit{Name: "specific_limit", Unit: "second", RequestsPerUnit: rpu(5)}},
		}},
		Descriptor{Key: "key_2", Value: "value_2", Descriptors: []Descriptor{
			{Key: "user", Value: "bkthomps", RateLimit: &RateLimit{Replaces: []string{"specific_limit"}, Unit: "second", RequestsPerUnit: rpu(10)}},
		}},
	)}})
	one := desc("key_1", "value_1", "user", "bkthomps")
	two := desc("key_2", "value_2", "user", "bkthomps")
	res := shouldRateLimit(t, c, request("example7", one, two))
	wantStatus(t, "replaced", res.GetStatuses()[0], codeOK, "", 0, "", 0, 0)
	if cl := res.GetStatuses()[1].GetCurrentLimit(); cl.GetRequestsPerUnit() != 10 || cl.GetName() != "" {
		t.Errorf("replacing: current_limit %v, want 10 per SECOND", cl)
	}
	// Alone, the named limit applies.
	res = shouldRateLimit(t, c, request("example7", one))
	if cl := res.GetStatuses()[0].GetCurrentLimit(); cl.GetRequestsPerUnit() != 5 || cl.GetName() != "specific_limit" {
		t.Errorf("alone: current_limit %v, want specific_limit, 5 per SECOND", cl)
	}
	got := envoyCounts(t, reader)
	if v := got["hits"]["example7/key_1_value_1.user_bkthomps"]; v != 1 {
		t.Errorf("the replaced limit counted %d hits, want 1 (only when alone)", v)
	}
}

// The global shadow mode answers overall OK and leaves the statuses; drop-in
// mode answers OK for an unknown domain.
func TestGlobalShadowAndDropIn(t *testing.T) {
	c, reader := fileService(t, Config{ShadowMode: true, DropIn: true, Domains: []Domain{fileDomain("e.yaml", "edge",
		Descriptor{Key: "k", RateLimit: perUnit(1, "hour")},
	)}})
	shouldRateLimit(t, c, request("edge", desc("k", "v")))
	res := shouldRateLimit(t, c, request("edge", desc("k", "v")))
	if res.GetOverallCode() != codeOK || res.GetStatuses()[0].GetCode() != codeOver {
		t.Errorf("global shadow mode: %v, want overall OK, the status OVER_LIMIT", res)
	}
	res = shouldRateLimit(t, c, request("nowhere", desc("k", "v"), desc("a", "b")))
	for i, st := range res.GetStatuses() {
		wantStatus(t, fmt.Sprint("unknown domain, descriptor ", i), st, codeOK, "", 0, "", 0, 0)
	}
	// Still validated.
	_, err := c.ShouldRateLimit(context.Background(), request("nowhere"))
	if !errors.Is(err, node.ErrInvalidInput) {
		t.Errorf("unknown domain, malformed descriptor: %v, want an input error", err)
	}
	got := envoyCounts(t, reader)
	if got["global_shadow_mode"][""] != 1 || got["domain_not_found"][""] != 1 {
		t.Errorf("global_shadow_mode %v, domain_not_found %v; want 1 and 1 (the malformed request is refused before its domain is looked up)", got["global_shadow_mode"], got["domain_not_found"])
	}

	// Drop-in mode serves even without domains.
	empty, _ := fileService(t, Config{DropIn: true})
	res = shouldRateLimit(t, empty, request("edge", desc("k", "v")))
	wantStatus(t, "no domains", res.GetStatuses()[0], codeOK, "", 0, "", 0, 0)
}

// A request is decided wholly by the rules before a swap or wholly by those
// after: with swaps racing requests, both descriptors of every answer
// always name the same rule set.
func TestSwitchIsAtomic(t *testing.T) {
	compile := func(name string) *Rules {
		lim := &RateLimit{Unit: "hour", RequestsPerUnit: rpu(1 << 30), Name: name}
		return compiled(t, Config{Domains: []Domain{fileDomain("s.yaml", "edge",
			Descriptor{Key: "a", RateLimit: lim}, Descriptor{Key: "b", RateLimit: lim},
		)}})
	}
	old, next := compile("old"), compile("new")
	sw := NewSwitch(old)
	c := newService(t, memory.New(nil, 0), sw, maxDescriptors, nil)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				sw.Swap(next)
			} else {
				sw.Swap(old)
			}
			// Pacing, not waiting: swaps stay frequent against requests
			// without the loop taking a whole core.
			time.Sleep(20 * time.Microsecond)
		}
	}()
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		res := shouldRateLimit(t, c, request("edge", desc("a", "1"), desc("b", "1")))
		x, y := res.GetStatuses()[0].GetCurrentLimit().GetName(), res.GetStatuses()[1].GetCurrentLimit().GetName()
		if x != y {
			t.Fatalf("request %d decided by two rule sets: %q and %q", i, x, y)
		}
		seen[x] = true
	}
	close(stop)
	wg.Wait()
	t.Logf("rule sets seen: %v", seen)

	// Swapping in no rules: every domain is unknown.
	sw.Swap(nil)
	_, err := c.ShouldRateLimit(context.Background(), request("edge", desc("a", "1")))
	if !errors.Is(err, ErrUnknownDomain) {
		t.Fatalf("after Swap(nil): %v, want ErrUnknownDomain", err)
	}
	if d := old.Domains(); len(d) != 1 || d[0] != "edge" {
		t.Errorf("Domains() = %v", d)
	}
}
