package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// This file writes `quotad --print-settings`: the effective value of
// every setting and where it came from.

// printSettings writes the effective settings of l (`quotad
// --print-settings`): every setting of the table, one a line, with its
// value and where the value came from. Passwords, and the password of a
// URL, are hidden; a setting without a value shows its default in
// parentheses.
func printSettings(w io.Writer, l loaded) error {
	fmt.Fprintln(w, "# quotad's effective settings: defaults, then the config file, then QUOTAD_* environment variables, then flags")
	if l.File.Path != "" {
		fmt.Fprintf(w, "# config file %s (sha256 %s): policies %d, envoy domains %d\n", l.File.Path, l.File.SHA256, len(l.Policies), len(l.Envoy.Domains))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range settings() {
		fmt.Fprintf(tw, "--%s\t%s\t%s\n", s.flag, effectiveValue(s, &l.config), l.from[s.flag])
	}
	return tw.Flush()
}

// effectiveValue is s's value in c as printSettings shows it.
func effectiveValue(s setting, c *config) string {
	v := s.v.format(c)
	var zero config
	switch {
	case v == "":
		return "(" + s.shownDefault() + ")"
	case s.secret:
		return "(hidden)"
	case v == s.v.format(&zero) && (s.zeroMeans != "" || s.unset != ""):
		return v + " (means " + s.shownDefault() + ")"
	case strings.Contains(v, "@"):
		// URLs and addresses with credentials, parsed or not.
		v = redactList(v)
	}
	if strings.ContainsAny(v, " \t") {
		return fmt.Sprintf("%q", v)
	}
	return v
}
