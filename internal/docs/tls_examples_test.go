package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotad/quotad/internal/testpki"
)

// docs/configuration.md's "TLS and the admin token": quotad started as the
// page says, with mutual TLS and an admin token, takes the page's Reset
// (curl, with the token) and its Check (grpcurl), each with a client
// certificate.
func TestTLSExampleRuns(t *testing.T) {
	text := section(t, "docs/configuration.md", "## TLS and the admin token")
	sh := blocks(text, "sh")
	if len(sh) != 2 {
		t.Fatalf("the section has %d shell blocks, want 2 (start, then call)", len(sh))
	}
	dir := t.TempDir()
	ca := testpki.NewCA(t, "docs CA")
	server, client := ca.Issue(t, "quotad", true), ca.Issue(t, "client", false)
	for name, content := range map[string][]byte{
		"ca.crt": ca.PEM, "tls.crt": server.CertPEM, "tls.key": server.KeyPEM,
		"client.crt": client.CertPEM, "client.key": client.KeyPEM, "admin.token": []byte("s3cret-token\n"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := freeAddr(t)
	env := shellEnv(t, addr, true)
	serve(t, env, dir, sh[0], addr)

	// The server's certificate names localhost, as the page's commands do.
	host := "localhost:" + addr[strings.LastIndex(addr, ":")+1:]
	out := shell(t, env, dir, sh[1], host)
	answers := splitJSON(t, out)
	if len(answers) != 2 {
		t.Fatalf("%d answers, want Reset's and Check's:\n%s", len(answers), out)
	}
	if strings.Join(strings.Fields(answers[0]), "") != "{}" {
		t.Errorf("Reset answered %s, want {} (done)", answers[0])
	}
	for _, want := range []string{`"allowed": true`, `"limit": "5"`, `"remaining": "4"`} {
		if !strings.Contains(answers[1], want) {
			t.Errorf("Check answered\n%s\nwithout %s", answers[1], want)
		}
	}

	// Without the token, the same Reset is refused: the example's token is
	// what made it pass.
	noToken := strings.Replace(sh[1], `-H "Authorization: Bearer $(cat admin.token)" `, "", 1)
	if noToken == sh[1] {
		t.Fatal("the example no longer sends the token as this test expects")
	}
	if refused := shell(t, env, dir, noToken, host); !strings.Contains(refused, `"code":"unauthenticated"`) {
		t.Errorf("Reset without the token answered %s, want unauthenticated", refused)
	}
}
