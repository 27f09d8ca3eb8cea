// Package rlqs is Envoy's rate limit quota service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService) without a
// wire: Envoy's rate_limit_quota filter enforces its buckets locally and
// streams their usage; this package answers each bucket with an
// assignment, a token bucket that is the Envoy's fair share of the quotad
// policy the bucket's rule names.
//
// The division is done in rounds of Config.AssignmentInterval, aligned to
// the wall clock so that every member of the cluster rounds together
// (rounds.go). Each round a member publishes the demand of its Envoys'
// buckets for each limit through the node (node.Node.ShareDemand) and
// reads every member's demand of the round before; all members so compute
// the same max-min fair level (fair.go), and each gives its own buckets
// min(demand, level), so that the rates assigned to all Envoys add up to
// at most the policy's rate. What the buckets reported allowed is charged
// at the authority (node.CheckOptions.Charge), so that other checks of
// the key see it; a debt the charge finds (Envoy starts every new token
// bucket full) is paid back by the next round dividing that much less.
//
// Files, bottom up: config.go (the rules' format), match.go (a bucket to
// its rule), fair.go (the water level), bucket.go (a rate as Envoy's token
// bucket), limit.go (a limit's buckets), stream.go (one Envoy's stream),
// rounds.go (the rounds), service.go (the service), stats.go (metrics and
// status).
package rlqs
