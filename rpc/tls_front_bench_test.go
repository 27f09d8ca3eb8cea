package rpc

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quotad/quotad/node"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// BenchmarkGRPCOverTLS compares the ways gRPC over TLS could be served on
// the API's port: the split after quotad's own TLS (grpc-go's transport),
// connect-go on net/http (ConnectOnly), and grpc-go's ServeHTTP behind
// net/http's TLS and HTTP/2 server. 16 clients, one hot key; cpu-µs/op is
// the process's CPU (client and server; the client is the same in all).
func BenchmarkGRPCOverTLS(b *testing.B) {
	h := memoryHandler(b, node.Policy{Name: "p", Limit: fiveAYear})
	cert, pool := selfSigned(b)
	serverTLS := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	start := func(b *testing.B, serve func(net.Listener)) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go serve(ln)
		b.Cleanup(func() { ln.Close() })
		return ln.Addr().String()
	}
	variants := map[string]func(b *testing.B) string{
		"split-grpc-go": func(b *testing.B) string {
			s, err := NewServer(h, h, ServerConfig{TLS: serverTLS}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return start(b, func(ln net.Listener) { _ = s.Serve(ln) })
		},
		"connect-only": func(b *testing.B) string {
			s, err := NewServer(h, h, ServerConfig{TLS: serverTLS, ConnectOnly: true}, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return start(b, func(ln net.Listener) { _ = s.Serve(ln) })
		},
		"grpc-servehttp": func(b *testing.B) string {
			g, err := newGRPCServer(h, ServerConfig{}.withDefaults())
			if err != nil {
				b.Fatal(err)
			}
			tc := serverTLS.Clone()
			tc.NextProtos = []string{"h2"}
			srv := &http.Server{Handler: g, TLSConfig: tc}
			b.Cleanup(func() { srv.Close() })
			return start(b, func(ln net.Listener) { _ = srv.ServeTLS(ln, "", "") })
		},
	}
	for _, name := range []string{"split-grpc-go", "connect-only", "grpc-servehttp"} {
		b.Run(name, func(b *testing.B) {
			addr := variants[name](b)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			req := &quotadv1.CheckRequest{Policy: "p", Key: "k", Cost: new(int64)}
			if err := conn.Invoke(context.Background(), "/quotad.v1.QuotaService/Check", req, &quotadv1.CheckResponse{}); err != nil {
				b.Fatal(err)
			}
			var before syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
			b.SetParallelism(8) // 16 clients on 2 CPUs
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				res := &quotadv1.CheckResponse{}
				for pb.Next() {
					if err := conn.Invoke(context.Background(), "/quotad.v1.QuotaService/Check", req, res); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			var after syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
			cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
