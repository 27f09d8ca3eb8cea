package node

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Natural batching of script calls. Checks that miss locally become script
// calls on a queue; a few pipeliners each take whatever has queued up while
// their previous round trip was in flight and send it as one pipeline. A
// lone call goes at once (no timer, so no added latency when idle); under
// load, calls for different keys share round trips. Calls for the same key
// are already coalesced by the node before they get here.

const (
	// pipeliners is how many round trips may be in flight at once. A call
	// that finds every pipeliner busy waits up to a whole round trip for
	// one: with Redis 18ms away and 4 pipeliners, that queueing alone made
	// a busy node miss the 50ms deadline on a third of its calls. Idle
	// pipeliners cost nothing, and under load each still takes everything
	// queued, so batches stay large where round trips are short.
	pipeliners = 16
	// poolSize is the connections a client keeps: one per pipeliner of the
	// check and release pipelines, and a few for pings, resets and script
	// loads, so no batch waits for a connection.
	poolSize = 2*pipeliners + 4
	// maxPipeline bounds one round trip, so that one huge batch does not
	// hold back the calls queued behind it.
	maxPipeline = 256
	// queueLen is the queue's capacity; a full queue makes callers wait
	// (back-pressure), bounded by their context.
	queueLen = 4096
)

// scriptCall is one queued EVALSHA and, once done is closed, its outcome.
type scriptCall struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	done   chan struct{}
	reply  any
	err    error
}

// pipeline sends queued script calls to Redis in batches.
//
// On Redis Cluster a batch is sent once, without go-redis's own pipeline
// retry: when the first command a node answered must be retried
// (TRYAGAIN, CLUSTERDOWN), go-redis resends that node's whole share of the
// batch, including commands that ran and commands it has already queued
// for an ASK target, so during a slot migration one script can run on two
// nodes at once, its reply written by two goroutines. Instead, the calls a
// batch got a redirection for (MOVED, ASK, TRYAGAIN: Redis refused to run
// them, so a resend cannot run one twice) are resent one by one through
// follow, whose single-command path follows redirections correctly.
type pipeline struct {
	// client sends batches; on Redis Cluster it must not follow
	// redirections (MaxRedirects -1).
	client redis.UniversalClient
	// follow resends redirected calls; nil leaves them failed.
	follow redis.UniversalClient
	// netTimeout bounds one batch at the network level, a new connection
	// included (RedisConfig.netTimeout). It is longer than any caller
	// waits: each caller leaves at its own deadline, while a reply that
	// comes late keeps its connection instead of costing a new one.
	netTimeout time.Duration
	queue      chan *scriptCall
	stop       chan struct{}
	stopped    sync.Once
	wg         sync.WaitGroup
	// reload loads every script again after a NOSCRIPT (Redis restarted,
	// failed over or flushed its script cache); reloading guards against
	// running it twice at once.
	reload    func(context.Context) error
	reloading atomic.Bool

	roundTrips, calls atomic.Int64
}

func newPipeline(client, follow redis.UniversalClient, netTimeout time.Duration, reload func(context.Context) error) *pipeline {
	p := &pipeline{
		client:     client,
		follow:     follow,
		netTimeout: netTimeout,
		queue:      make(chan *scriptCall, queueLen),
		stop:       make(chan struct{}),
		reload:     reload,
	}
	for range pipeliners {
		p.wg.Add(1)
		go p.loop()
	}
	return p
}

// run queues one script call and waits for its reply, at most until ctx is
// done. A call abandoned by its caller may still reach Redis.
func (p *pipeline) run(ctx context.Context, sc *redis.Script, keys []string, args []any) (any, error) {
	c := &scriptCall{ctx: ctx, script: sc, keys: keys, args: args, done: make(chan struct{})}
	select {
	case <-p.stop:
		return nil, redis.ErrClosed
	default:
	}
	select {
	case p.queue <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.stop:
		return nil, redis.ErrClosed
	}
	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.stop:
		// Enqueued as the pipeline closed: nobody may be left to answer.
		return nil, redis.ErrClosed
	}
}

// close stops the pipeliners; calls still queued fail with ErrClosed. It
// may be called more than once.
func (p *pipeline) close() {
	p.stopped.Do(func() { close(p.stop) })
	p.wg.Wait()
	for {
		select {
		case c := <-p.queue:
			c.err = redis.ErrClosed
			close(c.done)
		default:
			return
		}
	}
}

func (p *pipeline) loop() {
	defer p.wg.Done()
	batch := make([]*scriptCall, 0, maxPipeline)
	for {
		select {
		case <-p.stop:
			return
		case c := <-p.queue:
			batch = append(batch[:0], c)
		}
	fill:
		for len(batch) < maxPipeline {
			select {
			case c := <-p.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		p.send(batch)
		clear(batch) // drop references so finished calls can be collected
	}
}

// send runs batch as one pipeline of EVALSHAs, resends the calls it got a
// Cluster redirection for, then runs the calls that met NOSCRIPT again as
// EVALs (which load their script), and delivers every outcome.
func (p *pipeline) send(batch []*scriptCall) {
	live := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.netTimeout)
	defer cancel()
	p.calls.Add(int64(len(live)))
	cmds := p.exec(ctx, live, func(s redis.Scripter, c *scriptCall) *redis.Cmd {
		return c.script.EvalSha(ctx, s, c.keys, c.args...)
	})
	var missing []*scriptCall
	for i, c := range live {
		if err := cmds[i].Err(); err != nil && isNoScript(err) {
			missing = append(missing, c)
			continue
		}
		c.reply, c.err = cmds[i].Val(), cmds[i].Err()
		close(c.done)
	}
	if len(missing) == 0 {
		return
	}
	p.reloadInBackground()
	cmds = p.exec(ctx, missing, func(s redis.Scripter, c *scriptCall) *redis.Cmd {
		return c.script.Eval(ctx, s, c.keys, c.args...)
	})
	for i, c := range missing {
		c.reply, c.err = cmds[i].Val(), cmds[i].Err()
		close(c.done)
	}
}

// exec sends one command per call in one pipeline (a lone call is a
// pipeline of one: the same single round trip), then resends the calls
// Redis Cluster redirected, each on its own and all at once.
func (p *pipeline) exec(ctx context.Context, calls []*scriptCall, cmd func(redis.Scripter, *scriptCall) *redis.Cmd) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	p.roundTrips.Add(1)
	// Exec's own error repeats the first failed command's; each command
	// carries its own, which is what callers get.
	_, err := p.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
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
	for i, c := range calls {
		if err := cmds[i].Err(); err == nil || !isRedirect(err) {
			continue
		}
		p.roundTrips.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmds[i] = cmd(p.follow, c)
		}()
	}
	wg.Wait()
	return cmds
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
