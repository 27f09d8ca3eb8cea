// Package memcache is the memcached store: fixed windows counted in
// memcached, as envoyproxy/ratelimit's BACKEND_TYPE=memcache counts them.
//
// A check adds its cost to the window's counter (INCR; ADD with the
// window's expiry when the counter is missing; INCR again when another
// node's ADD came first) and gives back what it did not take (DECR): a
// plain check that does not fit, and the part of a lease that does not.
// The counter is never below the units admitted in its window, so the
// nodes sharing one memcached never admit more than the limit together;
// a denial given back a moment late may deny a check that would have fit.
//
// memcached has no clock a client can read and no scripts, so windows are
// aligned to the node's clock (Config.Now) and a store keeps fixed
// windows only (Store.Keeps). Keys are spread over the servers by the
// CRC-32 of the key, as gomemcache's ServerList spreads them: every node
// must list the same servers in the same order.
//
// It imports nothing of quotad but node's types and algorithms.
package memcache
