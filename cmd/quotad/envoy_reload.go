package main

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"time"

	"github.com/quotad/quotad/rpc"
)

// This file reloads the envoyproxy/ratelimit config directory
// (--envoy-config-dir) when its files change, by polling: the directory is
// small, and polling sees every way a file can change (edits, renames,
// Kubernetes swapping a ConfigMap's "..data" link) alike.

// envoyPollEvery is how often the directory is read for changes.
const envoyPollEvery = 2 * time.Second

// pollEnvoyDir keeps the rules in sw in step with c.EnvoyDir until ctx is
// done: every interval it reads the directory's config files and, when
// their names or contents differ from the last read, compiles them with
// the rest of c (config.envoyRules) and swaps them in, atomically. Files
// that do not compile, or a directory that cannot be read, leave the rules
// in force; the error is logged once until the files change again. loaded
// are the files the rules in sw came from.
func pollEnvoyDir(ctx context.Context, c config, loaded []envoyFile, sw *rpc.EnvoySwitch, interval time.Duration, log *slog.Logger) {
	last := envoyFilesHash(loaded)
	var lastErr string
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		files, err := readEnvoyFiles(c.EnvoyDir)
		if err != nil {
			if msg := err.Error(); msg != lastErr {
				log.Error("envoy rules not reloaded: the previous ones stay in force", "dir", c.EnvoyDir, "err", err)
				lastErr = msg
			}
			continue
		}
		h := envoyFilesHash(files)
		if h == last {
			continue
		}
		last = h
		rules, err := c.envoyRules(files)
		if err != nil {
			log.Error("envoy rules not reloaded: the previous ones stay in force", "dir", c.EnvoyDir, "err", err)
			lastErr = err.Error()
			continue
		}
		lastErr = ""
		sw.Swap(rules)
		log.Info("envoy rules reloaded", "dir", c.EnvoyDir, "files", len(files), "domains", rules.Domains())
	}
}

// envoyFilesHash identifies a set of files by their names and contents.
func envoyFilesHash(files []envoyFile) [sha256.Size]byte {
	h := sha256.New()
	for _, f := range files {
		// Lengths first, so that no two sets of files hash alike by
		// shifting bytes between a name and a content.
		var n [16]byte
		for i, v := range []int{len(f.name), len(f.raw)} {
			for j := 0; j < 8; j++ {
				n[i*8+j] = byte(v >> (8 * j))
			}
		}
		h.Write(n[:])
		h.Write([]byte(f.name))
		h.Write(f.raw)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
