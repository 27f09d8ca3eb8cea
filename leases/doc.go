// Package leases holds the rules a lease follows wherever it is held: in a
// quotad node (package node) or in a client's process (local mode, package
// rpc/quotadclient). A lease is a batch of units taken from the
// authoritative counter in one atomic call and spent locally; the rules
// here are what both holders must do alike so that the cluster never
// admits more than the limit:
//
//   - Units (grant.go): a grant's unspent units, spent lock-free, each at
//     most once and never after the grant's expiry;
//   - Demand (demand.go): a key's recent demand, which sizes the next
//     lease, and MinChecks, the smallest lease worth taking;
//   - Countdown (countdown.go): a remembered denial answered later, its
//     waits counted down in whole milliseconds as the store reports them;
//   - Table (table.go): the holder's leases by key, sharded and bounded.
//
// The package is pure: no I/O, and no clock but the times its callers
// pass (nanoseconds of the holder's monotonic clock).
package leases
