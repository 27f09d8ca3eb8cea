package envoycompat

import (
	"bufio"
	"context"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotad/quotad/internal/quotadtest"
)

// docsConfig returns the configuration under test: the first YAML block
// of docs/envoy.md's section "Configuration" (quotad's own schema), so that
// the documented example is the tested one.
func docsConfig(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Configuration\n")
	if !ok {
		t.Fatal("docs/envoy.md has no section Configuration")
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("docs/envoy.md's section Configuration has no YAML block")
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok || !strings.Contains(block, "envoy:") {
		t.Fatalf("docs/envoy.md's Configuration has no quotad config with an envoy section first:\n%s", block)
	}
	return block
}

// startQuotad builds cmd/quotad, runs it with cfg on a free loopback port
// until the test ends, and returns its host:port.
func startQuotad(t *testing.T, cfg string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "quotad.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, _ := runQuotad(t, "--config", path)
	return addr
}

// lockedBuffer is quotad's stderr, read while quotad writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runQuotad builds cmd/quotad, runs it with args on a free loopback port
// until the test ends, and returns its host:port and its stderr so far.
func runQuotad(t *testing.T, args ...string) (string, *lockedBuffer) {
	t.Helper()
	return runCommand(t, exec.Command(quotadtest.Binary(t), append([]string{"--listen", "127.0.0.1:0"}, args...)...))
}

// runCommand runs cmd, a quotad, until the test ends, and returns the
// host:port it says it listens on and its stderr so far.
func runCommand(t *testing.T, cmd *exec.Cmd) (string, *lockedBuffer) {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("quotad exited with %v\n%s", err, stderr.String())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("quotad did not stop within 15s of SIGTERM")
		}
	})
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("quotad printed nothing (%v); stderr:\n%s", lines.Err(), stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	const marker = "quotad listening on http://"
	first := lines.Text()
	if !strings.HasPrefix(first, marker) {
		t.Fatalf("first line %q does not say where quotad listens", first)
	}
	return strings.Fields(strings.TrimPrefix(first, marker))[0], stderr
}

func descriptor(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// go-control-plane's generated client, over grpc-go on cleartext HTTP/2,
// calls ShouldRateLimit on a quotad binary configured with docs/envoy.md's
// example: OK, then OVER_LIMIT, with every per-descriptor field as Envoy
// reads it.
func TestStockClient(t *testing.T) {
	addr := startQuotad(t, docsConfig(t))
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		res, err := client.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		if len(res.GetStatuses()) != len(req.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(res.GetStatuses()), len(req.GetDescriptors()))
		}
		return res
	}

	// per-ip is 3 per minute in a fixed window: the sequences below must
	// not straddle two windows.
	quotadtest.AwayFromWindowEnd(t, time.Minute, 20*time.Second)
	// Three descriptors in one request: limited, unlimited, unmatched.
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
		descriptor("remote_address", "192.0.2.1"),
		descriptor("remote_address", "10.0.0.2"),
		descriptor("user", "alice"),
	}}
	for i, want := range []struct {
		overall   rlsv3.RateLimitResponse_Code
		remaining uint32
	}{
		{rlsv3.RateLimitResponse_OK, 2},
		{rlsv3.RateLimitResponse_OK, 1},
		{rlsv3.RateLimitResponse_OK, 0},
		{rlsv3.RateLimitResponse_OVER_LIMIT, 0},
	} {
		res := call(req)
		if res.GetOverallCode() != want.overall {
			t.Fatalf("request %d: overall_code %s, want %s", i+1, res.GetOverallCode(), want.overall)
		}
		limited := res.GetStatuses()[0]
		if limited.GetCode() != want.overall || limited.GetLimitRemaining() != want.remaining {
			t.Errorf("request %d: limited descriptor code %s remaining %d, want %s %d", i+1, limited.GetCode(), limited.GetLimitRemaining(), want.overall, want.remaining)
		}
		cl := limited.GetCurrentLimit()
		if cl.GetName() != "per-ip" || cl.GetRequestsPerUnit() != 3 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || cl.GetUnitMultiplier() != nil {
			t.Errorf("request %d: current_limit %v, want per-ip, 3 per MINUTE", i+1, cl)
		}
		if d := limited.GetDurationUntilReset(); d == nil || d.AsDuration() <= 0 || d.AsDuration() > time.Minute {
			t.Errorf("request %d: duration_until_reset %v, want in (0, 60s]", i+1, d)
		}
		if u := res.GetStatuses()[1]; u.GetCode() != rlsv3.RateLimitResponse_OK || u.GetLimitRemaining() != math.MaxUint32 || u.GetCurrentLimit() != nil {
			t.Errorf("request %d: unlimited descriptor %v, want OK, remaining 4294967295, no limit", i+1, u)
		}
		if u := res.GetStatuses()[2]; u.GetCode() != rlsv3.RateLimitResponse_OK || u.GetCurrentLimit() != nil || u.GetDurationUntilReset() != nil {
			t.Errorf("request %d: unmatched descriptor %v, want OK and nothing else", i+1, u)
		}
	}

	// A nested rule, and both hits_addends: the request's 3 applies to the
	// first descriptor, the second descriptor's own 1 overrides it.
	res := call(&rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*commonv3.RateLimitDescriptor{
		descriptor("remote_address", "192.0.2.7", "path", "/login"),
		{Entries: descriptor("remote_address", "192.0.2.8", "path", "/login").GetEntries(), HitsAddend: wrapperspb.UInt64(1)},
	}})
	for i, remaining := range []uint32{1, 3} {
		st := res.GetStatuses()[i]
		cl := st.GetCurrentLimit()
		if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != remaining {
			t.Errorf("nested descriptor %d: code %s remaining %d, want OK %d", i, st.GetCode(), st.GetLimitRemaining(), remaining)
		}
		if cl.GetName() != "login-per-ip" || cl.GetRequestsPerUnit() != 2 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || cl.GetUnitMultiplier().GetValue() != 30 {
			t.Errorf("nested descriptor %d: current_limit %v, want login-per-ip, 2 per 30 SECOND", i, cl)
		}
	}

	// Fields are understood, not skipped: a limit override without a unit
	// and negative hits are InvalidArgument; an unknown domain NotFound.
	for _, tc := range []struct {
		req  *rlsv3.RateLimitRequest
		code codes.Code
		want string
	}{
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: descriptor("remote_address", "192.0.2.9").GetEntries(),
			Limit:   &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_UNKNOWN},
		}}}, codes.InvalidArgument, "descriptors[0].limit.unit"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: descriptor("remote_address", "192.0.2.9").GetEntries(), HitsAddend: wrapperspb.UInt64(1), IsNegativeHits: true,
		}}}, codes.InvalidArgument, "descriptors[0].is_negative_hits"},
		{&rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("remote_address", "192.0.2.9")}},
			codes.NotFound, `unknown domain "nope"`},
	} {
		_, err := client.ShouldRateLimit(ctx, tc.req)
		if s := status.Convert(err); s.Code() != tc.code || !strings.Contains(s.Message(), tc.want) {
			t.Errorf("ShouldRateLimit(%v): %v, want %s mentioning %q", tc.req, err, tc.code, tc.want)
		}
	}
}
