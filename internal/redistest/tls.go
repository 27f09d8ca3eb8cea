package redistest

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// WithTLS makes the server serve TLS as well, on a port of its own
// (TLSAddr), with certPEM and keyPEM, trusting caPEM's authorities for
// client certificates; requireClientCert makes it refuse a TLS client that
// presents none they signed (tls-auth-clients yes). The plaintext port
// stays, for the test's own commands (Do).
func WithTLS(certPEM, keyPEM, caPEM []byte, requireClientCert bool) Option {
	return func(s *Server) {
		s.t.Helper()
		write := func(name string, data []byte) string {
			p := filepath.Join(s.dir, name)
			if err := os.WriteFile(p, data, 0o600); err != nil {
				s.t.Fatalf("redistest: %v", err)
			}
			return p
		}
		port, err := FreePort()
		if err != nil {
			s.t.Fatalf("redistest: %v", err)
		}
		s.tlsPort = port
		auth := "no"
		if requireClientCert {
			auth = "yes"
		}
		s.args = append(s.args, "--tls-port", strconv.Itoa(port),
			"--tls-cert-file", write("tls.crt", certPEM), "--tls-key-file", write("tls.key", keyPEM),
			"--tls-ca-cert-file", write("tls-ca.pem", caPEM), "--tls-auth-clients", auth)
	}
}

// TLSAddr is the server's TLS address, 127.0.0.1:port, when it was
// started WithTLS; "" otherwise.
func (s *Server) TLSAddr() string {
	if s.tlsPort == 0 {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tlsPort))
}
