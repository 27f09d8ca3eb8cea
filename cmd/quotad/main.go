// Command quotad serves the quota (rate-limit) API over Connect, gRPC,
// gRPC-Web and HTTP/JSON on one port.
//
// With no flags it serves on :8080 with the embedded in-memory store; --redis
// makes Redis the authoritative store, --memcache memcached (fixed windows
// only). `quotad --help` lists every setting.
//
// `quotad check` asks a running quotad for one decision; `quotad check
// --help` explains it. `quotad envoy-ratelimit` runs quotad configured by
// envoyproxy/ratelimit's environment variables, on its ports. `quotad version` (or --version) prints the version,
// commit and Go version.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// SIGHUP reloads the configuration once quotad serves (run); until
	// then, and after, it is ignored: it must never end the process.
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(versionText())
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "check" {
		code := check(ctx, os.Args[2:], os.Getenv, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	runIt := func() error { return run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr) }
	if len(os.Args) > 1 && os.Args[1] == "envoy-ratelimit" {
		runIt = func() error { return envoyRatelimit(ctx, os.Args[2:], os.Environ(), os.Stdout, os.Stderr) }
	}
	if err := runIt(); err != nil {
		if err != errHelp {
			fmt.Fprintln(os.Stderr, "quotad:", err)
			os.Exit(1)
		}
	}
}
