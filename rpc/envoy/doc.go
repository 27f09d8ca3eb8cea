// Package envoy is Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) on a quotad node: the
// rules' format, in quotad's schema and in envoyproxy/ratelimit's config
// files (Config, config.go), and the parser of one such file's text
// (ParseFile, file_format.go); their compilation (Compile, compile.go) into
// immutable Rules and the Switch a running service reads them from
// (rules.go);
// the match of a descriptor to its rule and the key of its counter
// (match.go); the Service that plans and decides each request through
// node.Node (service.go); and envoyproxy/ratelimit's per-rule statistics
// (stats.go).
//
// It knows no wire. Package rpc mounts Service on its connect-go and
// grpc-go front ends and chooses the codes of its errors, which are plain:
// ErrUnknownDomain, input errors wrapping node.ErrInvalidInput, and the
// node's own. It reads no file: cmd/quotad reads the rules (its config
// file's envoy section, and envoyproxy/ratelimit's files, whose text it
// hands to ParseFile), compiles them with Compile and swaps them in on
// reload.
package envoy
