package main

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// --listen unix:PATH serves on a Unix socket; a socket file left by a
// process that was killed stops the start with the line that says to
// remove it, and the listener removes its own file when it closes.
func TestListenOnAUnixSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "q.sock")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false) // as a killed process leaves it
	stale.Close()
	want := "listen on unix:" + path + ": " + path + " exists: if no process serves on it (one that was killed leaves it), remove it and start again"
	if _, err := listen("unix:" + path); err == nil || err.Error() != want {
		t.Fatalf("listen over a stale socket: %v, want %q", err, want)
	}

	other := filepath.Join(t.TempDir(), "r.sock")
	ln, err := listen("unix:" + other)
	if err != nil {
		t.Fatal(err)
	}
	if got := displayURL(ln.Addr(), false); got != "unix:"+other {
		t.Errorf("displayURL %q, want unix:%s", got, other)
	}
	ln.Close()
	if ln, err := listen("unix:" + other); err != nil {
		t.Errorf("listen again after a clean close: %v", err)
	} else {
		ln.Close()
	}

	for arg, want := range map[string]string{
		"unix:": `listen: "unix:": want the socket's path after unix:, e.g. unix:/run/quotad.sock`,
		"x":     `listen: "x": want host:port, e.g. :8080 or 127.0.0.1:8080, or unix:/path for a Unix socket`,
	} {
		if _, err := loadConfig([]string{"--listen", arg}, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--listen %s: %v, want %q", arg, err, want)
		}
	}
	if c, err := loadConfig([]string{"--listen", "unix:" + path}, func(string) string { return "" }, io.Discard); err != nil || c.Listen != "unix:"+path {
		t.Errorf("--listen unix:%s: %v, %q", path, err, c.Listen)
	}
}
