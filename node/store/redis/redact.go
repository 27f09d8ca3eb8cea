package redis

import "strings"

// Redact returns s, a Redis URL or address as a user wrote it
// (redis://user:password@host:port/db, rediss://..., or user:password@host:port
// where an address was wanted), with the password replaced by "xxxxx", so
// that it may go into an error or a log line. It works on the text, not on
// a parsed URL: it must redact exactly the strings that do not parse. The
// user information is what lies between "://" (or the start) and the last
// "@" before any "?" or "#"; its password is what follows its first ":".
// A string without a password there is returned as it is.
func Redact(s string) string {
	before, _, after, ok := splitPassword(s)
	if !ok {
		return s
	}
	return before + "xxxxx" + after
}

// splitPassword cuts s around the password Redact hides.
func splitPassword(s string) (before, password, after string, ok bool) {
	end := len(s)
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		end = i
	}
	start := 0
	if i := strings.Index(s[:end], "://"); i >= 0 {
		start = i + len("://")
	}
	at := strings.LastIndex(s[start:end], "@")
	if at < 0 {
		return "", "", "", false
	}
	at += start
	colon := strings.Index(s[start:at], ":")
	if colon < 0 {
		return "", "", "", false
	}
	colon += start
	return s[:colon+1], s[colon+1 : at], s[at:], true
}

// redactIn returns msg with every occurrence of raw, a URL or address as
// the user wrote it, redacted, and then every occurrence of its password
// too, should a parser have quoted only a part of raw. (A password of
// fewer than 4 characters is left where it is not part of raw: replacing
// it everywhere would garble the message more than it hides.)
func redactIn(msg, raw string) string {
	msg = strings.ReplaceAll(msg, raw, Redact(raw))
	if _, pw, _, ok := splitPassword(raw); ok && len(pw) >= 4 {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
	}
	return msg
}
