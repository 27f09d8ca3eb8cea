package rpc

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// Inline limits whose state would outlive MaxInlinePeriod are
// InvalidArgument, naming the field that makes them so; configured
// policies are not bounded.
func TestMaxInlinePeriod(t *testing.T) {
	long := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 5, Period: algorithms.MaxPeriod}
	ts := startServer(t, memory.New(nil, 0), Config{}, node.Policy{Name: "yearly", Limit: long})
	c := ts.client(t, "grpc")
	ctx := context.Background()
	check := func(l *quotadv1.Limit) (*connect.Response[quotadv1.CheckResponse], error) {
		return c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: l}))
	}
	res, err := check(withLimit(func(l *quotadv1.Limit) { l.Period = durationpb.New(48 * time.Hour) }))
	assertError(t, res, err, connect.CodeInvalidArgument, "limit.period: invalid period: 48h0m0s exceeds this server's longest inline period 24h0m0s; use a configured policy for longer limits")
	res, err = check(&quotadv1.Limit{Algorithm: quotadv1.Algorithm_ALGORITHM_TOKEN_BUCKET, Limit: 10, Period: durationpb.New(time.Minute), Burst: 100_000})
	assertError(t, res, err, connect.CodeInvalidArgument, "limit.burst: invalid burst: a full burst of 100000 takes 166h40m0s to restore at 10 per 1m0s, longer than this server's longest inline period 24h0m0s")
	for _, l := range []*quotadv1.Limit{
		withLimit(func(l *quotadv1.Limit) { l.Period = durationpb.New(24 * time.Hour) }),
		{Algorithm: quotadv1.Algorithm_ALGORITHM_GCRA, Limit: 24, Period: durationpb.New(time.Hour), Burst: 576}, // exactly a day
	} {
		if res, err := check(l); err != nil || !res.Msg.GetAllowed() {
			t.Errorf("%v: %v, %v", l, res, err)
		}
	}
	if res, err := c.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "yearly", Key: "k"})); err != nil || !res.Msg.GetAllowed() {
		t.Errorf("a configured 365-day policy: %v, %v", res, err)
	}

	all := startServer(t, memory.New(nil, 0), Config{MaxInlinePeriod: algorithms.MaxPeriod}).client(t, "grpc")
	if res, err := all.Check(ctx, connect.NewRequest(&quotadv1.CheckRequest{Policy: "demo", Key: "k", Limit: withLimit(func(l *quotadv1.Limit) {
		l.Period = durationpb.New(algorithms.MaxPeriod)
	})})); err != nil || !res.Msg.GetAllowed() {
		t.Errorf("365 days with MaxInlinePeriod 365 days: %v, %v", res, err)
	}
	if err := (Config{MaxInlinePeriod: algorithms.MaxPeriod + time.Millisecond}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("MaxInlinePeriod over 365 days: %v", err)
	}
}

// A gzip message that inflates past MaxRequestBytes is ResourceExhausted
// once inflating has gone just past the limit, whether it is one member or
// ends in a small one; a corrupt one is InvalidArgument, as gzip says.
func TestGzipStopsAtTheLimit(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{MaxRequestBytes: 2000})
	for name, body := range map[string][]byte{"one member of 1 MiB": gzipMembers(1 << 20), "1 MiB, then a member of 1 byte": gzipMembers(1<<20, 1)} {
		status, raw := postGzipped(t, ts.URL, body)
		if status != http.StatusTooManyRequests || !strings.Contains(raw, "message is larger than configured max 2000: gzip: stopped inflating after 2001 bytes") {
			t.Errorf("%s: %d %s", name, status, raw)
		}
	}
	cut := gzipMembers(1500)
	status, raw := postGzipped(t, ts.URL, cut[:len(cut)-6])
	if status != http.StatusBadRequest || !strings.Contains(raw, "unexpected EOF") {
		t.Errorf("a body cut short: %d %s", status, raw)
	}
}

// postGzippedCheck posts a JSON Check to the server at url as one gzip
// member of n zero bytes, and returns the answer's status and body.
func postGzippedCheck(t *testing.T, url string, n int) (int, string) {
	t.Helper()
	return postGzipped(t, url, gzipMembers(n))
}

// gzipMembers is a gzip stream of one member per size, each of that many
// zero bytes.
func gzipMembers(sizes ...int) []byte {
	var body bytes.Buffer
	for _, n := range sizes {
		zw := gzip.NewWriter(&body)
		_, _ = zw.Write(make([]byte, n))
		_ = zw.Close()
	}
	return body.Bytes()
}

// postGzipped posts body to the server at url as a gzip-encoded JSON
// Check, and returns the answer's status and body.
func postGzipped(t *testing.T, url string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/quotad.v1.QuotaService/Check", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := http1Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(raw)
}
