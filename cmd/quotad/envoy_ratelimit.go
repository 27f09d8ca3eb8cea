package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/quotad/quotad/rpc"
)

// `quotad envoy-ratelimit` is quotad configured as envoyproxy/ratelimit
// is: by that project's environment variables (envoy_ratelimit_env.go),
// on its ports: gRPC (GRPC_PORT, 8081: quotad's one API port, every
// protocol), HTTP (PORT, 8080: the same API plus upstream's /healthcheck
// and /json), debug (DEBUG_PORT, 6070: Go's profiler) and, with
// USE_PROMETHEUS, the metrics (PROMETHEUS_ADDR and PROMETHEUS_PATH). A team
// running envoyproxy/ratelimit switches by changing the image only.

// shouldRateLimitPath is Envoy's ShouldRateLimit on quotad's API handler,
// where Connect's JSON reaches it.
const shouldRateLimitPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// envoyRatelimit runs `quotad envoy-ratelimit`. Arguments are refused: the
// environment is the whole configuration, as upstream's.
func envoyRatelimit(ctx context.Context, args []string, environ []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("envoy-ratelimit takes no arguments (%q): it is configured by envoyproxy/ratelimit's environment variables; see docs/envoy.md, Migrating", args[0])
	}
	tr, err := translateRatelimitEnv(environ)
	if err != nil {
		return err
	}
	for _, n := range tr.notes {
		fmt.Fprintln(stderr, "envoy-ratelimit:", n)
	}
	vars := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	for k, v := range tr.env {
		vars[k] = v
	}
	getenv := func(name string) string {
		// quotad's own QUOTAD_* variables would configure it beside
		// upstream's: only those the translation sets are read.
		if strings.HasPrefix(name, "QUOTAD_") {
			return tr.env[name]
		}
		return vars[name]
	}
	return runWith(ctx, tr.args, getenv, stdout, stderr, tr.serve)
}

// serve opens upstream's HTTP port and, with USE_PROMETHEUS, its metrics
// endpoint, both in front of quotad's API handler.
func (out ratelimitEnv) serve(api http.Handler, _ *rpc.Health, log *slog.Logger) ([]string, []*http.Server, []net.Listener, error) {
	var lines []string
	var servers []*http.Server
	var listeners []net.Listener
	open := func(addr string, h http.Handler, what string) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return fmt.Errorf("envoy-ratelimit: listen on %s (%s): %w", addr, what, err)
		}
		listeners = append(listeners, ln)
		servers = append(servers, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)})
		lines = append(lines, fmt.Sprintf("envoy-ratelimit: %s on http://%s", what, ln.Addr()))
		return nil
	}
	if err := open(out.httpListen, ratelimitHTTP(api), "HTTP port (/healthcheck, /json and the API)"); err != nil {
		return nil, nil, nil, err
	}
	if out.metricsListen != "" {
		metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != out.metricsPath {
				http.NotFound(w, r)
				return
			}
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/metrics"
			api.ServeHTTP(w, r2)
		})
		if err := open(out.metricsListen, metrics, "Prometheus metrics at "+out.metricsPath); err != nil {
			return nil, nil, nil, err
		}
	}
	return lines, servers, listeners, nil
}

// ratelimitHTTP is upstream's HTTP port in front of api: /healthcheck
// answers 200 "OK" while quotad is ready and 500 with the reason
// otherwise; /json takes a RateLimitRequest in protobuf's JSON (with any
// method, as upstream) and answers the RateLimitResponse, with status 429
// when it is OVER_LIMIT and 400 with quotad's error for a request that is
// not one; everything else is the API.
func ratelimitHTTP(api http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthcheck":
			rec := record(api, r, "/readyz", "")
			if rec.status != http.StatusOK {
				http.Error(w, strings.TrimSpace(rec.body.String()), http.StatusInternalServerError)
				return
			}
			_, _ = io.WriteString(w, "OK")
		case "/json":
			r2 := r.Clone(r.Context())
			r2.Method = http.MethodPost // as upstream, whatever the method
			rec := record(api, r2, shouldRateLimitPath, "application/json")
			status := rec.status
			var answer struct {
				OverallCode string `json:"overallCode"`
			}
			switch {
			case status == http.StatusOK && json.Unmarshal(rec.body.Bytes(), &answer) == nil && answer.OverallCode == "OVER_LIMIT":
				status = http.StatusTooManyRequests
			case status >= 400 && status < 500:
				status = http.StatusBadRequest
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write(rec.body.Bytes())
		default:
			api.ServeHTTP(w, r)
		}
	})
}

// recorded is a response kept in memory.
type recorded struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorded) Header() http.Header { return r.header }
func (r *recorded) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}
func (r *recorded) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

// record serves r on api at path (with contentType, if any) and returns
// the response.
func record(api http.Handler, r *http.Request, path, contentType string) *recorded {
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.RequestURI = path, ""
	// The answer is passed on as it is: uncompressed, as upstream's.
	r2.Header.Del("Accept-Encoding")
	if contentType != "" {
		r2.Header.Set("Content-Type", contentType)
	}
	rec := &recorded{header: http.Header{}}
	api.ServeHTTP(rec, r2)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return rec
}
