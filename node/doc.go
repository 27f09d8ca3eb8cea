// Package node is one quotad member: it decides checks of a key under a
// policy against the store that holds the authoritative counters, and
// keeps in process what spares the store calls. It holds:
//
//   - Node (node.go) and its Config (config.go): Check, CheckAll
//     (batch.go: all or nothing), the concurrency slots (slots.go), Reset,
//     SetPolicies (policy_set.go), status (stats.go, cluster_status.go,
//     decisions.go) and Close;
//   - the domain of a check: Policy, FailureMode, LeaseMode, Source, the
//     rules for names and keys, the errors (policy.go, lease.go);
//   - the Store interface it decides with (store.go, slots.go), the Redis
//     key layout its stores share (keys.go), and the circuit breaker in
//     front of a remote store (breaker.go); the stores are packages
//     node/store/redis and node/store/memory;
//   - in front of a remote store, the local layer (local.go, leasing.go):
//     leases (lease.go, in a leases.Table), remembered denials (denials.go),
//     coalesced store calls (refill.go), and the watch that drops them when
//     the store loses its state (store_state.go);
//   - the Cluster interface through which it sizes leases and gossips
//     denials and resets (cluster.go); package node/cluster implements it;
//   - its telemetry: spans, metrics (telemetry.go) and the debug log of
//     decisions (decision_log.go).
//
// A store failure is not an error of a check: the policy's failure mode
// decides, marked in the Result's Source.
package node
