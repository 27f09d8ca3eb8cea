// Package cache holds a quotad node's process-local hot state: the denied
// keys it can answer without asking the authority (Denied), backed by
// ristretto.
//
// Everything here is advisory. A lost, evicted or dropped entry only costs
// a call to the authoritative store; it never loosens a limit, and an entry
// that is present never denies a request the authority would have allowed.
//
// The package reads no clock for its decisions: every method that needs the
// time takes it as an argument, in whole milliseconds of any clock that
// never goes back (a node passes milliseconds since it started, read from
// Go's monotonic clock; Unix milliseconds do too while the wall clock is
// not stepped back). Only differences between readings matter, so the
// clock's zero is the caller's; callers must use one clock for a given
// cache. Ristretto's own TTL, which only reclaims memory, runs on the wall
// clock.
package cache
