package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/quotad/quotad/rpc"
	"github.com/quotad/quotad/rpc/envoyxds"
)

// This file takes envoyproxy/ratelimit's rules from an xDS management
// server (--envoy-xds-server): each response's resources are the rules
// directory's files, compiled with the configuration in force and swapped
// in as hot reload swaps them, or refused (the management server is told,
// NACK) with the rules in force kept. A reload of the config file compiles
// its policies with the last resources applied.

// defaultXDSNodeID is --envoy-xds-node-id's default, as
// envoyproxy/ratelimit's CONFIG_GRPC_XDS_NODE_ID.
const defaultXDSNodeID = "default"

// envoyXDSConfig is where the rules' management server is.
type envoyXDSConfig struct {
	// Server is the management server's host:port; empty: no xDS.
	Server string
	// NodeID is the node id quotad names itself with; empty means
	// defaultXDSNodeID.
	NodeID string
	// NodeMetadata and Headers are "key=value,key=value": the node's
	// metadata, and headers sent with the stream.
	NodeMetadata, Headers string
	// TLS dials the management server over TLS, trusting TLSCAFile (the
	// system's roots when empty), presenting TLSCertFile and TLSKeyFile
	// if set, and expecting TLSServerName (the host of Server when
	// empty).
	TLS                                               bool
	TLSCAFile, TLSCertFile, TLSKeyFile, TLSServerName string
	// RetryInterval is the wait before dialing again; 0 means 3s.
	RetryInterval time.Duration
}

func (x envoyXDSConfig) validate(envoyDir string) error {
	if x.Server == "" {
		if x.NodeID != "" {
			return errors.New("envoy xds: --envoy-xds-node-id needs --envoy-xds-server, the management server")
		}
		return nil
	}
	if envoyDir != "" {
		return errors.New("envoy xds: --envoy-xds-server and --envoy-config-dir are two sources of the same rules; choose one")
	}
	if _, _, err := net.SplitHostPort(x.Server); err != nil {
		return fmt.Errorf("envoy xds: --envoy-xds-server %q: want host:port (e.g. xds.example.com:18000): %v", x.Server, err)
	}
	for flag, v := range map[string]string{"--envoy-xds-node-metadata": x.NodeMetadata, "--envoy-xds-headers": x.Headers} {
		if _, err := keyValues(flag, v); err != nil {
			return err
		}
	}
	if !x.TLS && (x.TLSCAFile != "" || x.TLSCertFile != "" || x.TLSKeyFile != "" || x.TLSServerName != "") {
		return errors.New("envoy xds: --envoy-xds-tls-* files and server name need --envoy-xds-tls")
	}
	if x.RetryInterval < 0 {
		return fmt.Errorf("envoy xds: --envoy-xds-retry-interval %s must not be negative (0 means 3s)", x.RetryInterval)
	}
	return nil
}

// keyValues parses "key=value,key=value" (flag names the setting, for
// errors); empty is none.
func keyValues(flag, s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("envoy xds: %s %q: want key=value,key=value", flag, s)
		}
		out[k] = v
	}
	return out, nil
}

// clientConfig is the xDS client's configuration; it reads the TLS files.
func (x envoyXDSConfig) clientConfig() (envoyxds.Config, error) {
	cfg := envoyxds.Config{Server: x.Server, NodeID: x.nodeID(), RetryInterval: x.RetryInterval,
		MaxMessageBytes: maxEnvoyDirBytes}
	cfg.NodeMetadata, _ = keyValues("", x.NodeMetadata) // validated
	cfg.Headers, _ = keyValues("", x.Headers)
	if x.TLS {
		tc, err := clientTLS("--envoy-xds-tls", x.TLSCAFile, x.TLSCertFile, x.TLSKeyFile)
		if err != nil {
			return envoyxds.Config{}, fmt.Errorf("envoy xds: %w", err)
		}
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		tc.ServerName = x.TLSServerName
		if tc.ServerName == "" {
			tc.ServerName, _, _ = net.SplitHostPort(x.Server)
		}
		cfg.TLS = tc
	}
	return cfg, nil
}

func (x envoyXDSConfig) nodeID() string {
	if x.NodeID == "" {
		return defaultXDSNodeID
	}
	return x.NodeID
}

// xdsFiles are the resources last applied, as rules files.
type xdsFiles struct {
	mu      sync.Mutex
	version string
	files   []envoyFile
}

func (x *xdsFiles) current() (string, []envoyFile) {
	if x == nil {
		return "", nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.version, x.files
}

func (x *xdsFiles) set(version string, files []envoyFile) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.version, x.files = version, files
}

// xdsCurrent returns the version and files of the xDS resources last
// applied, or "" and files without --envoy-xds-server.
func (r *reloader) xdsCurrent(files []envoyFile) (string, []envoyFile) {
	if r.xds == nil {
		return "", files
	}
	return r.xds.current()
}

// startXDS holds the stream to the management server until ctx ends,
// applying each response through r.
func (r *reloader) startXDS(ctx context.Context, wg *sync.WaitGroup) {
	r.mu.Lock()
	x := r.cur.EnvoyXDS
	r.mu.Unlock()
	if x.Server == "" {
		return
	}
	cfg, err := x.clientConfig()
	if err != nil {
		// Checked at start (run), so this does not happen; if it did,
		// the rules in force would stay.
		r.log.Error("envoy xds: not started", "err", err)
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = envoyxds.Run(ctx, cfg, r.applyXDS, r.log)
	}()
}

// applyXDS compiles files, a management server's response, with the
// configuration in force and swaps the rules in, or returns why not and
// changes nothing.
func (r *reloader) applyXDS(version string, files []envoyxds.File) error {
	fs := make([]envoyFile, len(files))
	for i, f := range files {
		fs[i] = envoyFile{name: f.Name, raw: f.Text}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rules, err := r.cur.envoyRules(fs)
	if err != nil {
		return err
	}
	hash := xdsHash(r.cur, fs)
	v := rpc.ConfigVersion{Generation: r.version.Load().Generation + 1, Hash: hash, LoadedAt: time.Now()}
	if err := r.api.SetRules(rpc.Rules{Envoy: rules, Version: v}); err != nil {
		return err
	}
	r.xds.set(version, fs)
	r.version.Store(&v)
	return nil
}

// xdsHash identifies the configuration c with the xDS resources files.
func xdsHash(c config, files []envoyFile) string {
	dir := envoyFilesHash(files)
	h := sha256.New()
	h.Write([]byte(c.File.SHA256))
	h.Write([]byte{0})
	h.Write(dir[:])
	return fmt.Sprintf("%x", h.Sum(nil))
}
