package node

import (
	"context"
	"hash/fnv"
	"log/slog"
	"strconv"
	"time"
)

// This file is the debug log line of each decision.

// checkLogged is Check with a debug line per decision: the policy, a hash
// of the key (keys may be personal data, such as an address or a user id,
// and have no place in logs), the outcome, who decided, and how long it
// took. A failed check (bad input, the caller's context ending) logs its
// error instead of an outcome.
func (n *Node) checkLogged(ctx context.Context, p Policy, key string, cost int64, o CheckOptions) (Result, error) {
	start := time.Now()
	res, err := n.checkMeasured(ctx, p, key, cost, o)
	took := time.Since(start)
	if err != nil {
		n.log.LogAttrs(ctx, slog.LevelDebug, "check failed",
			slog.String("policy", p.Name), slog.String("key_hash", KeyHash(key)), slog.Int64("cost", cost),
			slog.Duration("latency", took), slog.Any("err", err))
		return res, err
	}
	outcome := "denied"
	if res.Allowed {
		outcome = "allowed"
	}
	n.log.LogAttrs(ctx, slog.LevelDebug, "decision",
		slog.String("policy", p.Name), slog.String("key_hash", KeyHash(key)), slog.Int64("cost", cost),
		slog.String("outcome", outcome), slog.String("source", res.Source.String()),
		slog.Int64("remaining", res.Remaining), slog.Duration("latency", took))
	return res, nil
}

// KeyHash is the name logs give key: the 64-bit FNV-1a hash of its bytes
// in 16 hex digits. It is the same on every node and in every run, so a
// key's lines can be followed across a cluster (compute it for a key you
// know to find its lines); it is not a secret.
func KeyHash(key string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	s := strconv.FormatUint(h.Sum64(), 16)
	for len(s) < 16 {
		s = "0" + s
	}
	return s
}
