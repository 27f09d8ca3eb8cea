// Package testpki makes the certificates tests need, with crypto/x509: a
// certificate authority and the server and client certificates it signs,
// valid for an hour around now. For tests only.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority that issues a test's server and client
// certificates.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // Cert, PEM-encoded
}

// Issued is a certificate and its key, in PEM and ready for crypto/tls.
type Issued struct {
	CertPEM, KeyPEM []byte
	Pair            tls.Certificate
	Serial          *big.Int
}

// serial numbers every certificate of the test binary differently.
var serial atomic.Int64

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// NewCA makes a self-signed certificate authority named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Issue signs a certificate for name: a server certificate for 127.0.0.1
// and localhost, or a client certificate.
func (ca *CA) Issue(t testing.TB, name string, server bool) Issued {
	t.Helper()
	if server {
		return ca.issue(t, name, true, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	}
	return ca.issue(t, name, false, nil, nil)
}

// IssueFor signs a certificate for name that carries exactly dnsNames as
// its subject alternative names, and no address: a server certificate that
// does not name 127.0.0.1, or a client certificate with names to check.
func (ca *CA) IssueFor(t testing.TB, name string, server bool, dnsNames ...string) Issued {
	t.Helper()
	return ca.issue(t, name, server, dnsNames, nil)
}

func (ca *CA) issue(t testing.TB, name string, server bool, dnsNames []string, ips []net.IP) Issued {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	tmpl.DNSNames, tmpl.IPAddresses = dnsNames, ips
	return ca.sign(t, tmpl, key)
}

// IssueMember signs a certificate for a cluster member named name that
// serves the API at ips and calls the other members' with the same
// certificate: good for both server and client authentication.
func (ca *CA) IssueMember(t testing.TB, name string, ips ...net.IP) Issued {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  ips,
	}
	return ca.sign(t, tmpl, key)
}

// sign makes the certificate of tmpl for key, signed by ca.
func (ca *CA) sign(t testing.TB, tmpl *x509.Certificate, key *ecdsa.PrivateKey) Issued {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	c := Issued{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		Serial:  tmpl.SerialNumber,
	}
	if c.Pair, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return c
}

// Pool is a certificate pool of the authority alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}
