package redis

import (
	"errors"
	"runtime"

	"github.com/quotad/quotad/algorithms"
	goredis "github.com/redis/go-redis/v9"
)

// This file is what a round trip carries: the queued calls grouped into
// wire commands (the checks of one algorithm in one batch script call,
// plain commands alone) and their replies handed back, a few callers at a
// time (pacer).

// wireCall is one command a pipeline sends: one queued call (an EVALSHA
// or a plain command), or several calls of one batch script (members, in
// queue order).
type wireCall struct {
	script *goredis.Script
	plain  []any
	// then and thenCmds are a plain call's further commands
	// (runPlainThen) and, once sent, their outcomes.
	then     [][]any
	thenCmds []*goredis.Cmd
	keys     []string
	args     []any
	members  []*scriptCall
	// keyBytes is the length of the members' keys, together.
	keyBytes int
}

// bulkWakeChunk is the bulk pipeline's wakeChunk. A round trip of a
// CheckBatch's items brings back up to 64 of them at once
// (node.BatchParallel), each waited for by a goroutine of its own. Woken
// all in one go, they fill the processor's run queue, and whatever becomes ready
// after them (a single check's request read from its connection, the check
// pipeline's pipeliner with a single check's reply) waits until all 64 have
// run: node 1's execution trace as the soak's key flood started had
// goroutines woken by Redis replies waiting 3.2 s in 5 s to run, and the
// legit checks' p99 of that sixth 2-4 times the others'. Yielding after
// every 8 lets what became ready meanwhile run between chunks; the batch
// itself waits about as long (its items' work is the same), and a single
// check waits behind at most 8 items' wake-ups, not 64.
const bulkWakeChunk = 8

// pacer counts the callers a pipeliner wakes in one delivery and yields
// the processor after every chunk of them. A nil pacer, or a chunk of 0,
// never yields.
type pacer struct {
	chunk, woken int
}

// woke notes one caller woken.
func (pc *pacer) woke() {
	if pc == nil || pc.chunk == 0 {
		return
	}
	if pc.woken++; pc.woken%pc.chunk == 0 {
		runtime.Gosched()
	}
}

// wireCalls groups calls into the commands that send them: calls of one
// batch script and group share one call of it (up to
// algorithms.MaxBatchChecks calls and algorithms.MaxBatchKeyBytes of keys
// each, in queue order); a call left alone, or without a batch form, goes
// as itself. A call for a key (a hash tag) that a plain call queued before
// it writes starts new batch calls, after that plain call, so that it
// also runs after it; calls of other keys still join the batches open
// before the plain call (cold keys' fresh writes, interleaved with warm
// keys' checks, would otherwise split every batch).
func wireCalls(calls []*scriptCall) []*wireCall {
	type groupKey struct {
		batch *goredis.Script
		group string
	}
	wire := make([]*wireCall, 0, len(calls))
	var open map[groupKey]*wireCall
	// written holds the hash tags of the plain calls sent since the open
	// batch calls were opened.
	var written map[string]struct{}
	for _, c := range calls {
		if c.plain != nil {
			wire = append(wire, &wireCall{plain: c.plain, then: c.then, keys: c.keys, members: []*scriptCall{c}})
			if len(open) > 0 {
				if written == nil {
					written = make(map[string]struct{})
				}
				written[hashTag(c.keys[0])] = struct{}{}
			}
			continue
		}
		if _, after := written[hashTag(c.keys[0])]; after {
			clear(open)
			clear(written)
		}
		if c.batch == nil {
			wire = append(wire, &wireCall{script: c.script, keys: c.keys, args: c.args, members: []*scriptCall{c}})
			continue
		}
		if open == nil {
			open = make(map[groupKey]*wireCall)
		}
		k := groupKey{c.batch, c.group}
		w := open[k]
		n := keyBytes(c.keys)
		if w == nil || len(w.members) == algorithms.MaxBatchChecks || w.keyBytes+n > algorithms.MaxBatchKeyBytes {
			w = &wireCall{}
			open[k] = w
			wire = append(wire, w)
		}
		w.members = append(w.members, c)
		w.keyBytes += n
	}
	for _, w := range wire {
		switch c := w.members[0]; {
		case w.script != nil, w.plain != nil:
		case len(w.members) == 1:
			w.script, w.keys, w.args = c.script, c.keys, c.args
		default:
			w.script = c.batch
			for _, m := range w.members {
				w.keys = append(w.keys, m.keys...)
				w.args = append(w.args, m.args...)
			}
		}
	}
	return wire
}

// keyBytes is the length of keys, together.
func keyBytes(keys []string) int {
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	return n
}

// deliver hands cmd's outcome to w's members: a lone call gets it as it
// is; the calls of a batch script each get their own reply or error, and
// all of them the call's error if it failed as a whole.
func (w *wireCall) deliver(cmd *goredis.Cmd, pace *pacer) {
	if len(w.members) == 1 {
		c := w.members[0]
		c.reply, c.err = cmd.Val(), cmd.Err()
		if len(w.thenCmds) > 0 {
			c.reply, c.err = allReplies(append([]*goredis.Cmd{cmd}, w.thenCmds...))
		}
		c.finish()
		pace.woke()
		return
	}
	items, err := cmd.Val(), cmd.Err()
	var replies []any
	if err == nil {
		replies, err = algorithms.SplitBatchReply(items, len(w.members))
	}
	for i, c := range w.members {
		switch {
		case err != nil:
			c.err = err
		default:
			if e, ok := replies[i].(error); ok {
				c.err = e
			} else {
				c.reply = replies[i]
			}
		}
		c.finish()
		pace.woke()
	}
}

// allReplies is the reply of a plain call with further commands
// (runPlainThen): every reply, a nil reply as nil, or the first error
// that is not goredis.Nil.
func allReplies(cmds []*goredis.Cmd) (any, error) {
	reply := make([]any, len(cmds))
	for i, c := range cmds {
		switch err := c.Err(); {
		case errors.Is(err, goredis.Nil):
		case err != nil:
			return nil, err
		default:
			reply[i] = c.Val()
		}
	}
	return reply, nil
}
