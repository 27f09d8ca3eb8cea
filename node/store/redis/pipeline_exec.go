package redis

import (
	"context"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// This file sends a round trip's commands to Redis: one pipeline per
// primary, Cluster redirects (MOVED, ASK, TRYAGAIN) followed by slot, and
// scripts reloaded after NOSCRIPT.

// exec sends one command per wire call in one pipeline (a lone call is a
// pipeline of one: the same single round trip), then resends the calls
// Redis Cluster redirected, each on its own and all at once.
func (p *pipeline) exec(ctx context.Context, calls []*wireCall, cmd func(commander, *wireCall) *goredis.Cmd) []*goredis.Cmd {
	cmds := make([]*goredis.Cmd, len(calls))
	// Exec's own error repeats the first failed command's; each command
	// carries its own, which is what callers get.
	_, err := p.client.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = cmd(pipe, c)
		}
		return nil
	})
	if err != nil {
		// Except when the pipeline never ran: go-redis (v9.17) leaves a
		// command that could not get a connection with neither an error nor
		// a reply once its retries are spent, and that must not read as a
		// malformed reply.
		for _, c := range cmds {
			if c.Err() == nil && c.Val() == nil {
				c.SetErr(err)
			}
		}
	}
	if p.follow == nil {
		return cmds
	}
	var wg sync.WaitGroup
	for _, group := range redirectedBySlot(calls, cmds) {
		wg.Go(func() {
			for _, i := range group {
				cmds[i] = cmd(p.follow, calls[i])
			}
		})
	}
	wg.Wait()
	return cmds
}

// redirectedBySlot returns the indexes of the calls whose commands Redis
// Cluster redirected, grouped by their keys' hash tag (so their slot), each
// group in the order sent. exec resends the groups at once and each
// group's calls one after another: two calls of one key, redirected
// together, must still run in their queue order.
func redirectedBySlot(calls []*wireCall, cmds []*goredis.Cmd) [][]int {
	var groups [][]int
	var at map[string]int
	for i, c := range calls {
		if err := cmds[i].Err(); err == nil || !isRedirect(err) {
			continue
		}
		tag := ""
		if len(c.keys) > 0 {
			tag = hashTag(c.keys[0])
		}
		if at == nil {
			at = make(map[string]int)
		}
		g, ok := at[tag]
		if !ok {
			g = len(groups)
			at[tag] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// reloadInBackground loads every script again, once at a time, so the
// next checks on a restarted Redis find them cached.
func (p *pipeline) reloadInBackground() {
	if !p.reloading.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer p.reloading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.reload(ctx) // a failure shows up as NOSCRIPT again on the next call
	}()
}

func isNoScript(err error) bool {
	return strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// isRedirect reports whether err is Redis Cluster refusing to run a
// command on this node for now: the slot moved (MOVED), is moving (ASK), or
// its keys are split mid-move (TRYAGAIN). CLUSTERDOWN is not one: no other
// node will take the command, and the call should fail fast.
func isRedirect(err error) bool {
	s := err.Error()
	return strings.HasPrefix(s, "MOVED ") || strings.HasPrefix(s, "ASK ") || strings.HasPrefix(s, "TRYAGAIN ")
}

// hashTag returns the part of a Redis key that decides its Cluster slot:
// the text between the first "{" and the first "}" after it, if not empty,
// else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}
