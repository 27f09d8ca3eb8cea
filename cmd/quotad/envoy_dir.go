package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/quotad/quotad/rpc/envoy"
	"github.com/quotad/quotad/yamlbound"
)

// This file loads a directory of envoyproxy/ratelimit config files
// (--envoy-config-dir), unchanged: each *.yaml or *.yml file is one domain
// in that project's format, which envoy.ParseFile parses into an
// envoy.Domain (File set). Here the files are read from disk and bounded
// as a directory, their domains compiled with the config file's envoy
// section (envoyRules), and the files hashed for reload.

// envoyFile is one config file: its name in the directory and its text.
type envoyFile struct {
	name string
	raw  []byte
}

// The bounds of an envoy config dir as a whole; each file is bounded as
// every file quotad reads (readFileBy) and every YAML text (yamlbound.Parse).
const (
	// maxEnvoyDirBytes is the most its config files may hold in all:
	// 4 MiB.
	maxEnvoyDirBytes = 4 * maxFileBytes
	// maxEnvoyDirNodes is the most YAML nodes, with aliases expanded,
	// its config files may hold in all.
	maxEnvoyDirNodes = 4 * yamlbound.MaxNodes
)

// readEnvoyFiles reads dir's config files, sorted by name: the files named
// *.yaml or *.yml (symbolic links followed), as every file quotad reads
// (readFileBy), all within fileReadTimeout and maxEnvoyDirBytes. Names
// starting with '.' are skipped, as Kubernetes' ConfigMap volumes keep
// their real files under "..data"; other files and subdirectories are not
// config files. A config file that is not a regular file (a named pipe) is
// refused.
func readEnvoyFiles(dir string) ([]envoyFile, error) {
	deadline := time.Now().Add(fileReadTimeout)
	entries, err := readDirBy(dir, deadline)
	if err != nil {
		return nil, err
	}
	var files []envoyFile
	total := 0
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || (filepath.Ext(name) != ".yaml" && filepath.Ext(name) != ".yml") {
			continue
		}
		path := filepath.Join(dir, name)
		// Stat never waits on a named pipe; readFileBy refuses one.
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			continue
		}
		raw, err := readFileBy(path, deadline)
		if err != nil {
			return nil, err
		}
		if total += len(raw); total > maxEnvoyDirBytes {
			return nil, fmt.Errorf("%s: its config files hold more than %d bytes (4 MiB) in all, the most quotad reads of one directory", dir, maxEnvoyDirBytes)
		}
		files = append(files, envoyFile{name: name, raw: raw})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	return files, nil
}

// envoyRules compiles the Envoy rules quotad serves with configuration c:
// the config file's envoy section and, when c.EnvoyDir is set, the domains
// of files, the directory's config files (readEnvoyFiles). It is a pure
// function of its arguments; hot reload (reload.go) calls it with the new
// configuration, then rpc.Handler.SetRules. nil rules (and
// no error) mean Envoy's rate limit service is not configured.
func (c config) envoyRules(files []envoyFile) (*envoy.Rules, error) {
	ec := c.envoyConfig()
	source := "envoy config dir " + c.EnvoyDir
	if c.EnvoyXDS.Server != "" {
		source = "envoy xds " + c.EnvoyXDS.Server
	}
	if c.EnvoyDir == "" && c.EnvoyXDS.Server == "" {
		if len(ec.Domains) == 0 {
			return nil, nil
		}
		rules, err := envoy.Compile(ec, c.Policies)
		if err != nil {
			return nil, fmt.Errorf("envoy: %w", err)
		}
		return rules, nil
	}
	ec.DropIn = true
	ec.Domains = slices.Clone(ec.Domains)
	nodes := 0
	for _, f := range files {
		// n is 0 when the YAML is refused; otherwise the directory's bound
		// comes before any mistake the walk found in the file.
		d, n, err := envoy.ParseFile(f.name, f.raw)
		if nodes+n > maxEnvoyDirNodes {
			err = fmt.Errorf("%s: the directory's config files hold more than %d YAML nodes (with aliases expanded) in all, the most quotad reads of one directory", f.name, maxEnvoyDirNodes)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		nodes += n
		ec.Domains = append(ec.Domains, d)
	}
	rules, err := envoy.Compile(ec, c.Policies)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return rules, nil
}

// loadEnvoy reads and compiles the Envoy rules of c (config.envoyRules),
// and returns the switch Envoy's rate limit service is to read them from
// (nil when it is not configured) and the directory's files it read.
func loadEnvoy(c config) (*envoy.Switch, []envoyFile, error) {
	var files []envoyFile
	if c.EnvoyDir != "" {
		var err error
		if files, err = readEnvoyFiles(c.EnvoyDir); err != nil {
			return nil, nil, fmt.Errorf("envoy config dir: %w", err)
		}
	}
	rules, err := c.envoyRules(files)
	if err != nil || rules == nil {
		return nil, files, err
	}
	return envoy.NewSwitch(rules), files, nil
}

// describeEnvoy says what Envoy's rate limit service serves, for the
// startup banner; "" when it is not configured.
func describeEnvoy(c config, sw *envoy.Switch) string {
	if sw == nil {
		return ""
	}
	s := "envoy: rate limit service for domains " + strings.Join(sw.Rules().Domains(), ", ")
	if c.EnvoyDir != "" {
		s += fmt.Sprintf(" (files of %s, checked for changes every %s)", c.EnvoyDir, configPollInterval)
	}
	if x := c.EnvoyXDS; x.Server != "" {
		s += fmt.Sprintf(" (rules from the xDS management server %s, as node %s)", x.Server, x.nodeID())
	}
	if c.Envoy.ShadowMode {
		s += "; global shadow mode: never OVER_LIMIT overall"
	}
	return s
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
