package quotadclient_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/node/store/memory"
	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/quotadclient"
)

// Runnable examples, which go test compiles and runs against a real
// quotad: a node on the embedded memory store behind rpc's handler, served
// in process on a loopback port as `go run ./cmd/quotad` serves on :8080.

// exampleQuotad serves quotad with the memory store and policies on a
// loopback port (HTTP/1.1 and cleartext HTTP/2, as cmd/quotad does) and
// returns its base URL and how to stop it.
func exampleQuotad(policies ...node.Policy) (url string, stop func()) {
	n, err := node.New(node.Config{Policies: policies}, memory.New(nil, 0), nil)
	if err != nil {
		log.Fatal(err)
	}
	h, err := rpc.NewHandler(n, rpc.Config{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	return srv.URL, func() {
		srv.Close()
		n.Close()
	}
}

// A policy configured on quotad is checked by name: two units a minute,
// then a denial with the time until a unit frees.
func ExampleClient_Check() {
	quotad, stop := exampleQuotad(node.Policy{
		Name:  "api",
		Limit: algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 2, Period: time.Minute},
	})
	defer stop()

	c, err := quotadclient.New(quotad, quotadclient.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		d, err := c.Check(context.Background(), "api", "user-1", 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(d.Allowed, d.Remaining, d.Source, d.RetryAfter > 59*time.Second)
	}
	// Output:
	// true 1 store false
	// true 0 store false
	// false 0 store true
}

// An inline limit travels with the request; its namespace ("signup")
// keeps its keys apart from other limits'. Cost 0 asks without spending.
func ExampleClient_CheckLimit() {
	quotad, stop := exampleQuotad()
	defer stop()

	c, err := quotadclient.New(quotad, quotadclient.Options{Protocol: quotadclient.ProtocolGRPC})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	limit := algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Hour, Burst: 3}
	for _, cost := range []int64{2, 0, 2} {
		d, err := c.CheckLimit(context.Background(), "signup", limit, "203.0.113.7", cost)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("cost %d: allowed %t, remaining %d\n", cost, d.Allowed, d.Remaining)
	}
	// Output:
	// cost 2: allowed true, remaining 1
	// cost 0: allowed true, remaining 1
	// cost 2: allowed false, remaining 1
}

// The README's middleware example: an HTTP API whose clients, told apart
// by their X-API-Key header, get five requests a minute each.
func ExampleMiddleware() {
	quotad, stop := exampleQuotad() // quotad on a loopback port, as `go run ./cmd/quotad` on :8080
	defer stop()

	c, err := quotadclient.New(quotad, quotadclient.Options{})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := quotadclient.Middleware(c, quotadclient.MiddlewareConfig{
		Policy: "demo", // a configured policy, or (with Limit) an inline limit's namespace
		Limit:  &algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 5, Period: time.Minute},
		Key:    quotadclient.KeyByHeader("X-API-Key"), // or KeyByIP(), KeyByRoute(mux)
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("hello\n"))
	})
	api := httptest.NewServer(limit(mux)) // or http.ListenAndServe(":9000", limit(mux))
	defer api.Close()

	for range 6 {
		req, _ := http.NewRequest("GET", api.URL+"/hello", nil)
		req.Header.Set("X-API-Key", "u1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status, resp.Header.Get("RateLimit-Policy"))
	}
	// Output:
	// 200 OK "demo";q=5;w=60
	// 200 OK "demo";q=5;w=60
	// 200 OK "demo";q=5;w=60
	// 200 OK "demo";q=5;w=60
	// 200 OK "demo";q=5;w=60
	// 429 Too Many Requests "demo";q=5;w=60
}

// The README's concurrency example: at most two requests of a tenant, told
// apart by its X-Tenant header, in flight at once; a third while two run is
// refused.
func ExampleConcurrencyMiddleware() {
	quotad, stop := exampleQuotad(node.Policy{Name: "gpu", Limit: algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 2, Period: time.Minute}})
	defer stop()

	c, err := quotadclient.New(quotad, quotadclient.Options{})
	if err != nil {
		log.Fatal(err)
	}
	inFlight, err := quotadclient.ConcurrencyMiddleware(c, quotadclient.ConcurrencyConfig{
		Policy: "gpu", // algorithm: concurrency
		Key:    quotadclient.KeyByHeader("X-Tenant"),
	})
	if err != nil {
		log.Fatal(err)
	}
	entered, finish := make(chan struct{}), make(chan struct{})
	api := httptest.NewServer(inFlight(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-finish // a long job
	})))
	defer api.Close()

	get := func() *http.Response {
		req, _ := http.NewRequest("GET", api.URL+"/render", nil)
		req.Header.Set("X-Tenant", "t1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	done := make(chan string, 2)
	for range 2 {
		go func() { done <- get().Status }()
		<-entered // the job holds one of the two slots
	}
	resp := get()
	fmt.Println(resp.Status, resp.Header.Get("RateLimit-Policy"), "Retry-After:", resp.Header.Get("Retry-After"))
	close(finish)
	fmt.Println(<-done)
	fmt.Println(<-done)
	// Output:
	// 429 Too Many Requests "gpu";q=2;qu="concurrent-requests" Retry-After: 1
	// 200 OK
	// 200 OK
}

// A token budget whose cost is known only once the work is done: reserve
// an estimate of 500 tokens, do the work, settle with the 120 it used,
// and 380 come back. A settle retried after a lost reply changes nothing.
func ExampleClient_Reserve() {
	quotad, stop := exampleQuotad(node.Policy{
		Name:  "llm-tokens",
		Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Limit: 1000, Period: time.Hour},
	})
	defer stop()

	c, err := quotadclient.New(quotad, quotadclient.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	d, r, err := c.Reserve(ctx, "llm-tokens", "team-a", 500, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Allowed, d.Remaining, r.ExpiresAfter)
	s, err := c.Settle(ctx, r, 120) // the tokens the response used
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.Outcome, s.Refunded, s.After.Remaining)
	s, err = c.Settle(ctx, r, 120)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.Outcome, s.Recorded, s.After.Remaining)
	// Output:
	// true 500 10m0s
	// settled 380 880
	// settled before 120 880
}

// A proxy in front of a model server charges each key the tokens its
// responses used, input and output tokens under limits of their own: each
// request reserves an estimate of both, and once the response is done
// the middleware settles them with the response's usage. The first
// response used 30 input and 250 output tokens, 50 output tokens beyond
// the estimate, charged all the same; the second request's estimate of
// 200 output tokens no longer fits in what is left, so it is refused
// until the bucket refills.
func ExampleTokenMiddleware() {
	quotad, stop := exampleQuotad() // quotad on a loopback port, as `go run ./cmd/quotad` on :8080
	defer stop()

	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"message":{"content":"..."}}],"usage":{"prompt_tokens":30,"completion_tokens":250}}`))
	}))
	defer model.Close()
	target, _ := url.Parse(model.URL)

	c, err := quotadclient.New(quotad, quotadclient.Options{})
	if err != nil {
		log.Fatal(err)
	}
	budget, err := quotadclient.TokenMiddleware(c, quotadclient.TokenMiddlewareConfig{
		Key: quotadclient.KeyByHeader("X-API-Key"),
		Input: quotadclient.TokenBudget{
			Policy:   "input-tokens",
			Limit:    &algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1000, Period: time.Hour},
			Estimate: func(r *http.Request) (int64, error) { return r.ContentLength / 4, nil }, // ~4 bytes a token
		},
		Output: quotadclient.TokenBudget{
			Policy:   "output-tokens",
			Limit:    &algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 300, Period: time.Hour},
			Estimate: func(*http.Request) (int64, error) { return 200, nil }, // the request's max_tokens
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	proxy := httptest.NewServer(budget(httputil.NewSingleHostReverseProxy(target)))
	defer proxy.Close()

	for range 2 {
		req, _ := http.NewRequest("POST", proxy.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","max_tokens":200,"messages":[{"role":"user","content":"Tell me about rate limits."}]}`))
		req.Header.Set("X-API-Key", "team-a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) // the body ends once the middleware has settled
		resp.Body.Close()
		fmt.Printf("%d Retry-After: %q\n", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	in, _ := c.CheckLimit(context.Background(), "input-tokens", algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 1000, Period: time.Hour}, "team-a", 0)
	out, _ := c.CheckLimit(context.Background(), "output-tokens", algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 300, Period: time.Hour}, "team-a", 0)
	fmt.Println("input tokens left:", in.Remaining, "output tokens left:", out.Remaining)
	// Output:
	// 200 Retry-After: ""
	// 429 Retry-After: "1800"
	// input tokens left: 970 output tokens left: 50
}
