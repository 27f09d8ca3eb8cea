// Package redis is the Redis store: the authority shared by every node,
// which runs the algorithms' Lua scripts (package algorithms) on a single
// server, a Redis Cluster or a master watched by Sentinel. It is the only
// package of quotad's server that imports go-redis (quotabench's
// internal/redisbench and test helpers are the others). It holds:
//
//   - Store, which implements node.Store and node.SlotStore over
//     pipelined script calls (pipeline.go: batching, with a short wait
//     for company under load, batch check scripts, Cluster redirections,
//     NOSCRIPT reloads; slots.go: the concurrency scripts), writes a
//     cold key's fresh state with one plain SET instead (redis.go Acquire,
//     key_memory.go: which keys it remembers holding state), and names the state it holds (epoch.go:
//     run_id and the state marker) so that a node notices a restarted,
//     failed-over or flushed Redis;
//   - Config, how to reach Redis, with its call and connect timeouts and
//     its batch window;
//   - the spans and metrics of its calls (telemetry.go).
package redis
