package rpc

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// serveAging serves h on a fresh 127.0.0.1 port with NewServer's server
// and cfg's connection age, until the test ends, and returns the base URL.
func serveAging(t *testing.T, h http.Handler, cfg ServerConfig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(nil, h, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// slowOrFast answers /slow once its request's wait channel is closed or
// its client has gone, and everything else at once.
func slowOrFast(release <-chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "done")
	})
}

// An aged HTTP/2 connection keeps a request in flight until the grace is
// over, then is closed under it; without a grace the request finishes
// however long it takes. Either way a request made once the connection is
// aged goes on a new connection and is answered.
func TestAgedConnectionsKeepTheirRequestsUntilTheGrace(t *testing.T) {
	for _, c := range []struct {
		name  string
		grace time.Duration
	}{{"grace cuts the request", 500 * time.Millisecond}, {"no grace waits for it", 0}} {
		t.Run(c.name, func(t *testing.T) {
			release := make(chan struct{})
			defer close(release)
			base := serveAging(t, slowOrFast(release), ServerConfig{MaxConnectionAge: 200 * time.Millisecond, MaxConnectionAgeGrace: c.grace})
			client := h2cClient(t)
			slow := make(chan error, 1)
			go func() {
				res, err := client.Get(base + "/slow")
				if err == nil {
					_, err = io.ReadAll(res.Body)
					res.Body.Close()
				}
				slow <- err
			}()
			// Past the age (200ms, +10% at most), a new request opens a new
			// connection: the aged one took its GOAWAY.
			time.Sleep(time.Second)
			res, err := client.Get(base + "/fast")
			if err != nil {
				t.Fatalf("a request after the age: %v", err)
			}
			res.Body.Close()
			if c.grace > 0 {
				select {
				case err := <-slow:
					if err == nil {
						t.Errorf("the request in flight past the grace was answered, want its connection closed under it")
					}
				case <-time.After(20 * time.Second):
					t.Fatal("the request in flight is still open 20s past the grace")
				}
				return
			}
			select {
			case err := <-slow:
				t.Fatalf("the request in flight ended before it was answered: %v", err)
			case <-time.After(500 * time.Millisecond):
			}
			release <- struct{}{}
			if err := <-slow; err != nil {
				t.Errorf("the request in flight on the aged connection, without a grace: %v, want it answered", err)
			}
		})
	}
}

// A grace without an age, or a negative one, is refused with what to set.
func TestMaxConnectionAgeSettingsRefused(t *testing.T) {
	for cfg, want := range map[ServerConfig]string{
		{MaxConnectionAgeGrace: time.Second}: "max connection age grace: invalid config: 1s follows a maximum connection age; set the age too",
		{MaxConnectionAge: -time.Second}:     "max connection age: invalid config: -1s and grace 0s must not be negative (0 means never)",
	} {
		if err := cfg.Validate(); err == nil || err.Error() != want {
			t.Errorf("%+v: %v, want %q", cfg, err, want)
		}
	}
}
