package main

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/testpki"
)

// returnsWithin calls f and fails the test if f has not returned within
// d: a read that waits for a named pipe's writer would never return.
func returnsWithin(t *testing.T, d time.Duration, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("still reading after %s", d)
		return nil
	}
}

// What is not a regular file is refused at once, saying what it is; a
// file over maxFileBytes is refused; a missing file is os.Open's error.
func TestReadFileRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	mkfifo(t, fifo)
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	exact := writeFile(t, "exact", strings.Repeat("x", maxFileBytes))
	over := writeFile(t, "over", strings.Repeat("x", maxFileBytes+1))
	for _, tc := range []struct {
		path, want string
	}{
		{fifo, fifo + " is a named pipe, not a regular file"},
		{sock, sock + " is a socket, not a regular file"},
		{dir, dir + " is a directory, not a regular file"},
		{os.DevNull, os.DevNull + " is a device, not a regular file"},
		{over, over + " is larger than 1048576 bytes (1 MiB), the most quotad reads of one file"},
		{filepath.Join(dir, "nope"), "open " + filepath.Join(dir, "nope") + ": no such file or directory"},
	} {
		err := returnsWithin(t, 5*time.Second, func() error { _, err := readFile(tc.path); return err })
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.path, err, tc.want)
		}
	}
	if b, err := readFile(exact); err != nil || len(b) != maxFileBytes {
		t.Errorf("a file of exactly %d bytes: %d bytes, %v", maxFileBytes, len(b), err)
	}
	if _, err := readDirBy(fifo, time.Now().Add(fileReadTimeout)); err == nil || err.Error() != fifo+" is a named pipe, not a directory" {
		t.Errorf("a named pipe as a directory: %v", err)
	}
	if _, err := readDirBy(exact, time.Now().Add(fileReadTimeout)); err == nil || err.Error() != exact+" is a regular file, not a directory" {
		t.Errorf("a file as a directory: %v", err)
	}
	var pe *fs.PathError
	if _, err := readFile(filepath.Join(dir, "nope")); !errors.As(err, &pe) {
		t.Errorf("a missing file: %T, want *fs.PathError", err)
	}
}

// A read that does not finish by its deadline (a file system that does not
// answer) returns an error then, without waiting for the read.
func TestReadGivesUpAtItsDeadline(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	start := time.Now()
	_, err := within("/mnt/hung/q.yaml", time.Now().Add(50*time.Millisecond), func() ([]byte, error) {
		<-block
		return nil, nil
	})
	if !errors.Is(err, errReadTimeout) || err.Error() != "/mnt/hung/q.yaml: not read in time (5s allowed); is it on a file system that does not answer?" {
		t.Errorf("%v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("returned after %s", took)
	}
}

// Every file quotad reads, at start or on reload, refuses a named pipe at
// once and names it: the config file, the envoy config dir and its files,
// the TLS certificate, key and client CA, the admin token, the cluster
// key, Redis' CA and client certificate and key, and quotad check's TLS
// files.
func TestEveryFileRefusesANamedPipe(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "pipe")
	mkfifo(t, fifo)
	ca := testpki.NewCA(t, "ca")
	server := ca.Issue(t, "quotad", true)
	crt := writeFile(t, "tls.crt", string(server.CertPEM))
	key := writeFile(t, "tls.key", string(server.KeyPEM))
	noEnv := func(string) string { return "" }
	want := fifo + " is a named pipe, not a regular file"
	for _, tc := range []struct {
		name string
		read func() error
	}{
		{"--config", func() error { _, err := loadConfig([]string{"--config", fifo}, noEnv, io.Discard); return err }},
		{"--envoy-config-dir", func() error { _, _, err := loadEnvoy(config{EnvoyDir: fifo}); return err }},
		{"--tls-cert-file", func() error {
			_, err := loadConfig([]string{"--tls-cert-file", fifo, "--tls-key-file", key}, noEnv, io.Discard)
			return err
		}},
		{"--tls-key-file", func() error {
			_, err := loadConfig([]string{"--tls-cert-file", crt, "--tls-key-file", fifo}, noEnv, io.Discard)
			return err
		}},
		{"--tls-client-ca-file", func() error {
			_, err := loadConfig([]string{"--tls-cert-file", crt, "--tls-key-file", key, "--tls-client-ca-file", fifo}, noEnv, io.Discard)
			return err
		}},
		{"--admin-token-file", func() error {
			_, err := loadConfig([]string{"--admin-token-file", fifo}, noEnv, io.Discard)
			return err
		}},
		{"--cluster-key-file", func() error {
			_, err := clusterConfig{Addr: "127.0.0.1:0", KeyFile: fifo}.membershipConfig()
			return err
		}},
		{"--redis-tls-ca", func() error { return openRedisWith("--redis-tls-ca", fifo) }},
		{"--redis-tls-cert-file", func() error {
			return openRedisWith("--redis-tls-cert-file", fifo, "--redis-tls-key-file", key)
		}},
		{"--redis-tls-key-file", func() error {
			return openRedisWith("--redis-tls-cert-file", crt, "--redis-tls-key-file", fifo)
		}},
		{"quotad check --tls-ca-file", func() error { _, err := clientTLS("--tls", fifo, "", ""); return err }},
		{"quotad check --tls-cert-file", func() error { _, err := clientTLS("--tls", "", fifo, key); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := returnsWithin(t, 10*time.Second, tc.read)
			w := want
			if tc.name == "--envoy-config-dir" {
				w = fifo + " is a named pipe, not a directory"
			}
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v, want an error saying %q", err, w)
			}
		})
	}
}

// openRedisWith opens the store of a rediss:// Redis at a port nothing
// listens on with flags besides: a file the flags name is read before the
// first dial, so its error is the one returned.
func openRedisWith(flags ...string) error {
	c, err := loadConfig(append([]string{"--redis", "rediss://127.0.0.1:1/0"}, flags...), func(string) string { return "" }, io.Discard)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := openStore(ctx, c)
	if err == nil {
		s.Close()
	}
	return err
}
