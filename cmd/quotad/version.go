package main

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
)

// errVersion means --version was asked for; run prints versionText.
var errVersion = errors.New("version requested")

// versionText is what `quotad version` and `quotad --version` print, one
// line read from the build information the Go toolchain embeds:
//
//	quotad v0.0.0-20261101120000-0123456789ab+dirty commit 0123456789abcdef (modified) go1.26.8 linux/amd64
//
// The version is the main module's: a tag, a pseudo-version from the
// commit, or "(devel)" when the build had no version control information
// (go build -buildvcs=false, or no .git, as in a Docker build context);
// the commit is "unknown" then. `make build` and `make install` stamp both.
func versionText() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "quotad (unknown version: no build information in this binary)"
	}
	return formatVersion(info)
}

func formatVersion(info *debug.BuildInfo) string {
	version := info.Main.Version
	if version == "" {
		version = "(devel)"
	}
	commit, modified, goos, goarch := "unknown", false, "", ""
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "quotad %s commit %s", version, commit)
	if modified {
		b.WriteString(" (modified)")
	}
	fmt.Fprintf(&b, " %s", info.GoVersion)
	if goos != "" && goarch != "" {
		fmt.Fprintf(&b, " %s/%s", goos, goarch)
	}
	return b.String()
}
