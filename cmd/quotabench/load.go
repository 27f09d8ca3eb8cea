package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
	"github.com/quotad/quotad/rpc/protoconv"
)

// numSources is the number of values of quotadv1.Source, UNSPECIFIED
// included; a source outside that range is counted as UNSPECIFIED.
const numSources = int(quotadv1.Source_SOURCE_FAIL_CLOSED) + 1

// tally is what one client saw. Each client owns one, so the hot path takes
// no lock; the run adds them up at the end.
type tally struct {
	hist    histogram // latency of answered checks (allowed or denied)
	allowed [numSources]int64
	denied  [numSources]int64
	errors  map[connect.Code]int64
}

// outcome is the whole run: every client's tally merged.
type outcome struct {
	elapsed time.Duration
	latency merged
	allowed [numSources]int64
	denied  [numSources]int64
	errors  map[connect.Code]int64
}

func (o *outcome) add(t *tally) {
	o.latency.add(&t.hist)
	for i := range numSources {
		o.allowed[i] += t.allowed[i]
		o.denied[i] += t.denied[i]
	}
	for c, n := range t.errors {
		o.errors[c] += n
	}
}

// answered is the number of checks that got a decision.
func (o *outcome) answered() (allowed, denied int64) {
	for i := range numSources {
		allowed += o.allowed[i]
		denied += o.denied[i]
	}
	return allowed, denied
}

// failed is the number of checks that ended in an error.
func (o *outcome) failed() int64 {
	var n int64
	for _, c := range o.errors {
		n += c
	}
	return n
}

// newHTTPClient returns the HTTP client every worker shares: HTTP/1.1 for
// Connect, cleartext HTTP/2 with prior knowledge (h2c) for gRPC. The idle
// pool holds a connection per client so that HTTP/1.1 workers do not
// reconnect between checks.
func newHTTPClient(cfg config) (*http.Client, *http.Transport) {
	tr := &http.Transport{
		MaxIdleConns:        cfg.Clients,
		MaxIdleConnsPerHost: cfg.Clients,
		IdleConnTimeout:     90 * time.Second,
		// Connect and gRPC negotiate their own compression.
		DisableCompression: true,
		Protocols:          new(http.Protocols),
	}
	if cfg.Protocol == protocolGRPC {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	return &http.Client{Transport: tr}, tr
}

// newQuotaClient returns the generated client for cfg's protocol.
func newQuotaClient(cfg config, hc *http.Client) quotadv1connect.QuotaServiceClient {
	var opts []connect.ClientOption
	if cfg.Protocol == protocolGRPC {
		opts = append(opts, connect.WithGRPC())
	}
	if !cfg.Gzip {
		// Removes the gzip connect-go accepts by default.
		opts = append(opts, connect.WithAcceptCompression("gzip", nil, nil))
	}
	return quotadv1connect.NewQuotaServiceClient(hc, cfg.Addr, opts...)
}

// requestTemplate is the check every client sends, without its key.
func requestTemplate(cfg config) *quotadv1.CheckRequest {
	cost := cfg.Cost
	req := &quotadv1.CheckRequest{Policy: cfg.Policy, Cost: &cost}
	if l := cfg.Inline; l != nil {
		req.Limit = &quotadv1.Limit{
			Algorithm: protoconv.AlgorithmToProto(l.Algorithm),
			Limit:     l.Limit,
			Period:    durationpb.New(l.Period),
			Burst:     l.Burst,
		}
		switch cfg.Fail {
		case "open":
			req.Limit.OnStoreError = quotadv1.FailureMode_FAILURE_MODE_OPEN
		case "closed":
			req.Limit.OnStoreError = quotadv1.FailureMode_FAILURE_MODE_CLOSED
		}
	}
	return req
}

// keyGen draws keys for one client. It is not safe for concurrent use:
// each client has its own, seeded from -seed and the client's index, so
// that equal seeds give equal key sequences per client.
type keyGen struct {
	prefix string
	buf    []byte
	next   func() uint64
}

func newKeyGen(cfg config, client int) *keyGen {
	r := rand.New(rand.NewPCG(cfg.Seed, uint64(client)))
	g := &keyGen{prefix: cfg.KeyPrefix, buf: make([]byte, 0, len(cfg.KeyPrefix)+20)}
	switch cfg.Keys {
	case keysSingle:
		g.next = func() uint64 { return 0 }
	case keysZipf:
		// Rank 0 is the hottest key; v = 1 as in the classic definition.
		z := rand.NewZipf(r, cfg.ZipfS, 1, uint64(cfg.NKeys-1))
		g.next = z.Uint64
	default:
		n := uint64(cfg.NKeys)
		g.next = func() uint64 { return r.Uint64N(n) }
	}
	return g
}

// key returns the next key: the prefix followed by the key's index.
func (g *keyGen) key() string {
	g.buf = strconv.AppendUint(append(g.buf[:0], g.prefix...), g.next(), 10)
	return string(g.buf)
}

// load runs the benchmark: cfg.Clients workers, each with one check in
// flight, start checks until cfg.Duration has passed, cfg.Requests checks
// have been started or ctx is done. Checks in flight when the time is up
// finish and are counted; checks cut short because ctx was cancelled are
// not.
func load(ctx context.Context, cfg config, client quotadv1connect.QuotaServiceClient) outcome {
	stopAt, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var started atomic.Int64
	tallies := make([]tally, cfg.Clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range tallies {
		t := &tallies[i]
		t.errors = map[connect.Code]int64{}
		keys := newKeyGen(cfg, i)
		wg.Go(func() {
			// One message per client, reused: the client serializes it
			// before Check returns.
			msg := requestTemplate(cfg)
			for stopAt.Err() == nil {
				if cfg.Requests > 0 && started.Add(1) > cfg.Requests {
					return
				}
				msg.Key = keys.key()
				checkOnce(ctx, cfg.Timeout, client, msg, t)
			}
		})
	}
	wg.Wait()
	o := outcome{elapsed: time.Since(start), errors: map[connect.Code]int64{}}
	for i := range tallies {
		o.add(&tallies[i])
	}
	return o
}

// checkOnce sends one check and records its outcome in t.
func checkOnce(ctx context.Context, timeout time.Duration, client quotadv1connect.QuotaServiceClient, msg *quotadv1.CheckRequest, t *tally) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	begin := time.Now()
	resp, err := client.Check(cctx, connect.NewRequest(msg))
	took := time.Since(begin)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return // interrupted by the user, not quotad's doing
		}
		t.errors[connect.CodeOf(err)]++
		return
	}
	t.hist.record(took)
	src := int(resp.Msg.GetSource())
	if src < 0 || src >= numSources {
		src = 0
	}
	if resp.Msg.GetAllowed() {
		t.allowed[src]++
	} else {
		t.denied[src]++
	}
}
