package quotadclient_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// OpenAIUsage reads both OpenAI APIs' usage, in a JSON body and in the
// last event of a stream that carries one, and says so when there is none.
func TestOpenAIUsage(t *testing.T) {
	for name, tc := range map[string]struct {
		body    string
		in, out int64
		ok      bool
	}{
		"chat completions": {`{"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`, 12, 34, true},
		"responses":        {`{"output":[],"usage":{"input_tokens":5,"output_tokens":6}}`, 5, 6, true},
		"a stream": {"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":8}}\n\ndata: [DONE]\n\n", 7, 8, true},
		"no usage":         {`{"choices":[]}`, 0, 0, false},
		"half a usage":     {`{"usage":{"prompt_tokens":7}}`, 0, 0, false},
		"not json":         {`upstream timed out`, 0, 0, false},
		"a stream without": {"data: {\"choices\":[]}\n\ndata: [DONE]\n\n", 0, 0, false},
	} {
		in, out, ok := quotadclient.OpenAIUsage([]byte(tc.body))
		if in != tc.in || out != tc.out || ok != tc.ok {
			t.Errorf("%s: %d, %d, %v; want %d, %d, %v", name, in, out, ok, tc.in, tc.out, tc.ok)
		}
	}
}

// A response that does not say what it used is settled at the estimates:
// the tokens stay charged. One that streams reaches the client as it is
// written and is settled from its last event's usage.
func TestTokenMiddlewareSettlesWhatTheResponseSays(t *testing.T) {
	quotad, stop := exampleQuotad()
	defer stop()
	c, err := quotadclient.New(quotad, quotadclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	limit := algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: time.Hour}
	budget, err := quotadclient.TokenMiddleware(c, quotadclient.TokenMiddlewareConfig{
		Key:    quotadclient.KeyByHeader("X-API-Key"),
		Output: quotadclient.TokenBudget{Policy: "out", Limit: &limit, Estimate: func(*http.Request) (int64, error) { return 100, nil }},
		Log:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	flushed := make(chan bool, 1)
	srv := httptest.NewServer(budget(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/silent":
			w.Write([]byte(`{"choices":[]}`))
		case "/stream":
			w.Write([]byte("data: {\"choices\":[]}\n\n"))
			flushed <- http.NewResponseController(w).Flush() == nil
			w.Write([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":340}}\n\ndata: [DONE]\n\n"))
		}
	})))
	defer srv.Close()
	remaining := func(key string) int64 {
		d, err := c.CheckLimit(context.Background(), "out", limit, key, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	get := func(path, key string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		// The body ends when the middleware has settled.
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("RateLimit"), `"out"`) {
			t.Fatalf("%s: %d, RateLimit %q", path, resp.StatusCode, resp.Header.Get("RateLimit"))
		}
	}
	get("/silent", "a")
	if got := remaining("a"); got != 900 {
		t.Errorf("after a response without usage: %d remaining, want 900 (the estimate of 100 kept)", got)
	}
	get("/stream", "b")
	if !<-flushed {
		t.Error("the stream could not be flushed through the middleware")
	}
	if got := remaining("b"); got != 660 {
		t.Errorf("after a stream that used 340: %d remaining, want 660", got)
	}
}

// A configuration that cannot work is refused when the middleware is made.
func TestTokenMiddlewareRefusesBadConfig(t *testing.T) {
	c, err := quotadclient.New("http://127.0.0.1:1", quotadclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	est := func(*http.Request) (int64, error) { return 1, nil }
	key := quotadclient.KeyByHeader("X-API-Key")
	for name, tc := range map[string]struct {
		cfg  quotadclient.TokenMiddlewareConfig
		want string
	}{
		"no key":      {quotadclient.TokenMiddlewareConfig{Input: quotadclient.TokenBudget{Policy: "p", Estimate: est}}, "key:"},
		"no budget":   {quotadclient.TokenMiddlewareConfig{Key: key}, "set at least one"},
		"no estimate": {quotadclient.TokenMiddlewareConfig{Key: key, Output: quotadclient.TokenBudget{Policy: "p"}}, "output: an Estimate is required"},
		"a bad limit": {quotadclient.TokenMiddlewareConfig{Key: key, Input: quotadclient.TokenBudget{Policy: "p", Estimate: est, Limit: &algorithms.Limit{}}}, "input limit:"},
	} {
		if _, err := quotadclient.TokenMiddleware(c, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", name, err, tc.want)
		}
	}
}
