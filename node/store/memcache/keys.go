package memcache

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// This file is the key of a window and how long memcached keeps it.

// maxKeyLen is the longest key memcached takes.
const maxKeyLen = 250

// maxRelativeExpiry is the longest expiry memcached reads as seconds from
// now; a larger number is a Unix time.
const maxRelativeExpiry = 30 * 24 * 60 * 60

// windowKey is the key of the window that starts at startMs under base:
// base:fw:START, as it is when memcached can take it (at most 250 bytes,
// no space nor control character); else '#' and the hex SHA-256 of it.
// A base starts with '{' (node's key layout), so the two forms never meet.
func windowKey(base string, startMs int64) string {
	k := base + ":fw:" + strconv.FormatInt(startMs, 10)
	if len(k) <= maxKeyLen && plain(k) {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "#" + hex.EncodeToString(sum[:])
}

// plain reports whether k has no byte memcached's text protocol forbids in
// a key: a space, a control character, DEL.
func plain(k string) bool {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// expiry is memcached's expiry of a window that ends at endMs, seen at
// nowMs: whole seconds to its end rounded up, and one more, since
// memcached's clock ticks once a second and may take a second off; a
// Unix time for a window that ends more than 30 days on. A key kept past
// its window is harmless: the next window has a key of its own.
func expiry(nowMs, endMs int64) int64 {
	secs := (endMs-nowMs+999)/1000 + 1
	if secs <= maxRelativeExpiry {
		return secs
	}
	return (endMs+999)/1000 + 1
}
