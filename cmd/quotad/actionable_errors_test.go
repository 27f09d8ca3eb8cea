package main

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/quotadtest"
	"github.com/quotad/quotad/internal/redistest"
)

// A first mistake is answered with what to write instead, by the built
// binary: one line, no usage, no library's words alone.
func TestStartErrorsSayHowToFixThem(t *testing.T) {
	r := redistest.Start(t)
	for _, c := range []struct {
		name string
		args []string
		want string
		not  string
	}{
		{"unknown flag", []string{"--lsiten", ":8080"}, "quotad: unknown flag --lsiten; did you mean --listen? (quotad --help lists every flag)", "Usage"},
		{"a flag near a file key", []string{"--redis-ur", "redis://" + r.Addr()}, "quotad: unknown flag --redis-ur; did you mean --redis? (quotad --help lists every flag)", "--redis-db"},
		{"a port alone", []string{"--listen", "8080"}, `listen: "8080" is a port alone; write :8080 (every interface) or 127.0.0.1:8080 (this machine only)`, ""},
		{"a setting out of range", []string{"--max-connections", "-1"}, "max connections: invalid config: -1 must be > 0", "rpc config"},
		{"TLS to a plaintext Redis", []string{"--listen", "127.0.0.1:0", "--redis", "rediss://" + r.Addr() + "/0"},
			"quotad: redis store: TLS with redis at " + r.Addr() + " failed: the handshake got no answer, and " + r.Addr() + " answers plaintext Redis commands, so it does not speak TLS; use redis:// (or --redis-tls off), or enable TLS on the server",
			"context deadline exceeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, quotadtest.Binary(t), c.args...).CombinedOutput()
			if err == nil {
				t.Fatalf("started:\n%s", out)
			}
			text := string(out)
			// go-redis logs its own dial failures; quotad's words are one line.
			var ours []string
			for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
				if !strings.HasPrefix(l, "redis: ") {
					ours = append(ours, l)
				}
			}
			if len(ours) != 1 {
				t.Fatalf("%d lines, want one:\n%s", len(ours), text)
			}
			if !strings.Contains(ours[0], c.want) || (c.not != "" && strings.Contains(ours[0], c.not)) {
				t.Errorf("printed\n%s\nwant %q%s", text, c.want, map[bool]string{true: " and not " + c.not, false: ""}[c.not != ""])
			}
		})
	}
}

// The HTTP/JSON API of a built quotad takes the config file's spellings
// (an algorithm as fixed_window, a period as 60 or "1m") and answers a
// mistake with what is accepted.
func TestJSONSpellingsOfTheConfigFile(t *testing.T) {
	addr := startBinary(t)
	post := func(body string) (int, string) {
		t.Helper()
		res, err := http.Post(addr+"/quotad.v1.QuotaService/Check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, limit := range []string{
		`{"algorithm":"fixed_window","limit":"5","period":"60s"}`,
		`{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":60}`,
		`{"algorithm":"token_bucket","limit":"5","period":"1m"}`,
	} {
		if code, body := post(`{"policy":"p","key":"k","limit":` + limit + `}`); code != 200 || !strings.Contains(body, `"allowed":true`) {
			t.Errorf("limit %s: %d %s, want allowed", limit, code, body)
		}
	}
	// The whole answer: the field, what it takes, what it got, and none of
	// protojson's own words.
	for _, c := range []struct{ limit, want string }{
		{`{"algorithm":"fixed","limit":"5","period":"60s"}`, `{"code":"invalid_argument","message":"unmarshal message: limit.algorithm: want one of ALGORITHM_FIXED_WINDOW, ALGORITHM_SLIDING_WINDOW_LOG, ALGORITHM_SLIDING_WINDOW_COUNTER, ALGORITHM_TOKEN_BUCKET, ALGORITHM_LEAKY_BUCKET, ALGORITHM_GCRA, ALGORITHM_CONCURRENCY, or as the config file spells them, fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra, concurrency; got \"fixed\""}`},
		{`{"algorithm":"fixed_window","limit":"5","period":"a while"}`, `{"code":"invalid_argument","message":"unmarshal message: limit.period: want a duration such as \"60s\" (seconds), \"1m\" or \"500ms\", or a number of seconds; got \"a while\""}`},
	} {
		if code, body := post(`{"policy":"p","key":"k","limit":` + c.limit + `}`); code != 400 || body != c.want {
			t.Errorf("limit %s: %d %s, want 400 %s", c.limit, code, body, c.want)
		}
	}
}
