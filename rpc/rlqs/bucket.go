package rlqs

import (
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	typev3 "github.com/quotad/quotad/proto/envoy/type/v3"
)

// This file writes a rate as the token bucket Envoy enforces: Envoy
// refills a bucket continuously at tokens_per_fill per fill_interval,
// counting the interval in whole seconds, starts it full with max_tokens,
// and keeps a bucket whose assignment comes again unchanged.

// maxFillSeconds is the longest fill interval bucketFor writes: the rate's
// granularity is 1/maxFillSeconds tokens a second.
const maxFillSeconds = 10

// burstSeconds and minBurst size a bucket's max_tokens (bucketFor).
const (
	burstSeconds = 0.1
	minBurst     = 2
)

// bucketConfig is a token bucket as Envoy reads it. The zero value is no
// bucket (DENY_ALL).
type bucketConfig struct {
	maxTokens     uint32
	tokensPerFill uint32
	fillSeconds   int64
}

// bucketFor is the token bucket of the highest rate at most rate (tokens
// a second) that Envoy can enforce: tokens_per_fill over a fill interval
// of 1 to maxFillSeconds whole seconds, the shortest of the best; the
// zero bucketConfig when rate is below one token per maxFillSeconds. Its
// max_tokens is a tenth of a second's worth, at least minBurst: Envoy
// starts every new bucket full, so each new bucket may admit its
// max_tokens at once, beyond its rate; a small burst keeps that small,
// and enough to absorb requests arriving a little early.
func bucketFor(rate float64) bucketConfig {
	if !(rate > 0) {
		return bucketConfig{}
	}
	var best bucketConfig
	for s := int64(1); s <= maxFillSeconds; s++ {
		tokens := math.Floor(rate*float64(s) + 1e-9)
		if tokens > math.MaxUint32 {
			tokens = math.MaxUint32
		}
		c := bucketConfig{tokensPerFill: uint32(tokens), fillSeconds: s}
		if c.tokensPerFill > 0 && c.rate() > best.rate()+1e-12 {
			best = c
		}
	}
	if best.tokensPerFill == 0 {
		return bucketConfig{}
	}
	best.maxTokens = uint32(min(math.Ceil(best.rate()*burstSeconds), math.MaxUint32))
	best.maxTokens = max(best.maxTokens, minBurst)
	return best
}

// rate is the bucket's refill rate in tokens a second; 0 for no bucket.
func (c bucketConfig) rate() float64 {
	if c.fillSeconds == 0 {
		return 0
	}
	return float64(c.tokensPerFill) / float64(c.fillSeconds)
}

// none reports whether c is no bucket.
func (c bucketConfig) none() bool { return c.tokensPerFill == 0 }

// strategy is c as Envoy's RateLimitStrategy: a token bucket, or
// DENY_ALL for no bucket.
func (c bucketConfig) strategy() *typev3.RateLimitStrategy {
	if c.none() {
		return blanket(false)
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     c.maxTokens,
		TokensPerFill: wrapperspb.UInt32(c.tokensPerFill),
		FillInterval:  durationpb.New(time.Duration(c.fillSeconds) * time.Second),
	}}}
}

// blanket is ALLOW_ALL for allow, else DENY_ALL.
func blanket(allow bool) *typev3.RateLimitStrategy {
	rule := typev3.RateLimitStrategy_DENY_ALL
	if allow {
		rule = typev3.RateLimitStrategy_ALLOW_ALL
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}
}
