package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Batching of script calls. Checks that miss locally become script calls
// on a queue; a few pipeliners take turns taking calls off it, each sending
// what it took as one pipeline. A pipeliner takes the call at the head and
// whatever else has queued up (calls that came while round trips were in
// flight); then, while calls have been coming faster than one per batch
// window (Config.BatchWindow), it waits for company: until the window
// since the first call has passed, the batch is full, or no call has come
// for a few of the usual gaps between calls (the callers are all in the
// batch). A call on a quiet node, or after a pause of a window or more,
// goes at once, and so does one already near its deadline, so the window
// costs a lone call nothing and a slow Redis no deadlines. Under load,
// calls share round trips, and Redis pays once per round trip for its
// read, write and wakeup. Checks queued together are also decided
// together: the checks of one algorithm in a batch go to Redis as one call
// of its batch script (algorithms.BatchCheckScript), which pays once for
// EVALSHA and Redis TIME; on Redis Cluster only checks whose keys share a
// hash tag (so a slot) go in one call. A fresh write (a plain SET ... NX,
// algorithms.Fresh) rides in the same round trips as a command of its own.
// Calls for one key run in the order they queued, each its own atomic
// decision.

const (
	// pipeliners is how many round trips may be in flight at once. A call
	// that finds every pipeliner busy waits up to a whole round trip for
	// one: with Redis 18ms away and 4 pipeliners, that queueing alone made
	// a busy node miss the 50ms deadline on a third of its calls. Idle
	// pipeliners cost nothing, and under load each still takes everything
	// queued.
	pipeliners = 16
	// minActive is the fewest pipeliners that take calls. How many do
	// adapts to the round trip (see pipeline.wantActive): where round
	// trips are short, a call waits little for a busy pipeliner, and the
	// fewer round trips in flight, the more calls each batches, and the
	// less Redis spends per call (one read and one write for many calls,
	// one batch script call for many checks).
	minActive = 2
	// activeShare is the fraction of the call timeout that a call may wait
	// for a busy pipeliner: with a round trip of rtt, about
	// pipeliners × rtt / (timeout / activeShare) pipeliners take calls.
	activeShare = 5
	// poolSize is the connections a client keeps: one per pipeliner of the
	// check, bulk and release pipelines, and a few for pings, resets and
	// script loads, so no batch waits for a connection.
	poolSize = 3*pipeliners + 4
	// maxPipeline bounds one round trip, so that one huge batch does not
	// hold back the calls queued behind it.
	maxPipeline = 256
	// queueLen is the queue's capacity; a full queue makes callers wait
	// (back-pressure), bounded by their context.
	queueLen = 4096
	// maxWindowShare bounds the batch window at this fraction of the call
	// timeout (Config.Validate).
	maxWindowShare = 20
	// quietGaps ends a wait for company when no call has come for this
	// many of the usual gaps between calls: the callers are all in the
	// batch, or the burst is over.
	quietGaps = 4
	// gapWeight is the weight of a new gap between queued calls in their
	// smoothed gap (1/gapWeight); gapCap bounds one gap, in windows, so
	// that a few calls after an idle spell bring the estimate back.
	gapWeight = 8
	gapCap    = 10
	// companyScale is the fixed point of pipeline.others: a call waits
	// for company only while calls have found at least half a call
	// pending beside them, on average.
	companyScale = 1024
)

// scriptCall is one queued EVALSHA, or one plain command (a fresh write,
// algorithms.Fresh), and, once done is closed, its outcome.
type scriptCall struct {
	// ctx is the caller's, and deadline when it stops waiting (run): a
	// call whose caller has left is not sent.
	ctx      context.Context
	deadline time.Time
	script   *goredis.Script
	// batch is script's batch form, which decides several calls of script
	// in one (nil: the call goes alone). group is what calls must share to
	// go in one batch call: "" on a single server, the keys' hash tag on
	// Redis Cluster.
	batch *goredis.Script
	group string
	keys  []string
	args  []any
	// plain, if not nil, is the call instead of a script: a command and
	// its arguments, whose only key is keys[0]. then are more commands
	// sent right after it, in the same round trip, in order; the call's
	// reply is then every command's (runPlainThen).
	plain []any
	then  [][]any
	// gap is the time since the call queued before this one, -1 if none
	// or if the pipeline never waits.
	gap   time.Duration
	done  chan struct{}
	reply any
	err   error
	// state says whether the caller still waits (callWaiting), had its
	// outcome (callFinished) or left without it (callLeft): the first of
	// finish and leave to change it decides.
	state atomic.Int32
	// late, if not nil, is given the reply of a call whose caller left
	// without it (finish).
	late func(reply any)
}

// The states of a scriptCall.
const (
	callWaiting int32 = iota
	callFinished
	callLeft
)

// finish hands c its outcome, c.reply and c.err, set before: to its
// caller if it still waits; else a reply goes to c.late, on a goroutine of
// its own, so that what a call took after its caller left can be given
// back.
func (c *scriptCall) finish() {
	if !c.state.CompareAndSwap(callWaiting, callFinished) && c.late != nil && c.err == nil {
		go c.late(c.reply)
	}
	close(c.done)
}

// leave reports whether c's caller may leave without its outcome: false
// when the outcome is being handed over (finish came first), and must be
// waited for on c.done.
func (c *scriptCall) leave() bool { return c.state.CompareAndSwap(callWaiting, callLeft) }

// commander sends script calls and plain commands: a go-redis pipeline,
// or a client (resends).
type commander interface {
	goredis.Scripter
	Do(ctx context.Context, args ...any) *goredis.Cmd
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
// follow, whose single-command path follows redirections correctly: those
// of one slot one after another, in the order sent, so two calls of one
// key keep their order (redirectedBySlot).
type pipeline struct {
	// client sends batches; on Redis Cluster it must not follow
	// redirections (MaxRedirects -1).
	client goredis.UniversalClient
	// follow resends redirected calls; nil leaves them failed.
	follow goredis.UniversalClient
	// netTimeout bounds one batch at the network level, a new connection
	// included (Config.netTimeout). It is longer than any caller
	// waits: each caller leaves at its own deadline, while a reply that
	// comes late keeps its connection instead of costing a new one.
	netTimeout time.Duration
	queue      chan *scriptCall
	stop       chan struct{}
	stopped    sync.Once
	wg         sync.WaitGroup
	// live tells, for a call whose deadline passed, whether Redis or the
	// node was late (liveness.go).
	live *liveness
	// reload loads every script again after a NOSCRIPT (Redis restarted,
	// failed over or flushed its script cache); reloading guards against
	// running it twice at once.
	reload    func(context.Context) error
	reloading atomic.Bool
	// cluster groups batch calls by hash tag.
	cluster bool
	// callTimeout is how long a caller waits for its call
	// (Config.Timeout): how many pipeliners take calls adapts to it.
	callTimeout time.Duration
	// tokens gate the pipeliners: one takes calls off the queue only while
	// it holds a token, so at most active round trips are in flight.
	tokens chan struct{}
	mu     sync.Mutex // guards active and rtt
	active int        // tokens in circulation, minActive..pipeliners
	rtt    time.Duration

	// window is the longest a pipeliner that took a call waits for more
	// while calls arrive fast (see gather); 0 never waits.
	window time.Duration
	// taking lets one pipeliner at a time take calls off the queue, so
	// that calls gathered in one window are not split between two.
	taking chan struct{}
	// epoch is the zero of lastCall; lastCall is when the last call was
	// queued and gap the smoothed time between queued calls (ns). pending
	// is the calls queued or in flight, and others the smoothed number of
	// them a call found when it came, in 1/companyScale: a lone caller
	// that calls again as soon as it has its answer, however fast, finds
	// none. Racy but approximate by design: they only decide whether
	// company is worth waiting for.
	epoch    time.Time
	lastCall atomic.Int64
	gap      atomic.Int64
	pending  atomic.Int64
	others   atomic.Int64
	// lastRTT is rtt, for urgent to read without the lock.
	lastRTT atomic.Int64

	// wakeChunk, if not 0, makes the pipeliner yield its processor after
	// waking every wakeChunk callers (see pacer).
	wakeChunk int

	// scripts counts the EVALSHAs sent (Store.ScriptCalls), plain the
	// plain commands (Store.PlainCalls), roundTrips the pipelines that
	// carried them (Store.RoundTrips), waited the batches that waited for
	// company.
	scripts, plain, roundTrips, waited atomic.Int64
}

func newPipeline(client, follow goredis.UniversalClient, live *liveness, callTimeout, netTimeout, window time.Duration, reload func(context.Context) error) *pipeline {
	p := &pipeline{
		live:        live,
		window:      window,
		taking:      make(chan struct{}, 1),
		epoch:       time.Now(),
		client:      client,
		follow:      follow,
		netTimeout:  netTimeout,
		callTimeout: callTimeout,
		queue:       make(chan *scriptCall, queueLen),
		stop:        make(chan struct{}),
		reload:      reload,
		tokens:      make(chan struct{}, pipeliners),
		active:      pipeliners,
	}
	_, p.cluster = client.(*goredis.ClusterClient)
	p.taking <- struct{}{}
	for range pipeliners {
		p.tokens <- struct{}{}
	}
	for range pipeliners {
		p.wg.Add(1)
		go p.loop()
	}
	return p
}

// run queues one script call and waits for its reply, at most timeout
// (then failing with context.DeadlineExceeded if Redis was late, or with
// an error wrapping node.ErrOverloaded if the node was: see missed) and
// until ctx is done.
// batch, if not nil, is sc's batch form (algorithms.BatchCheckScript): the
// call may then be decided in one call of it with others queued beside it.
// A call abandoned by its caller may still reach Redis.
//
// late, if not nil, is given the reply should it come after the caller
// left without it (its deadline passed, or ctx ended).
//
// The timeout is a timer rather than a context.WithTimeout of ctx: under a
// cancelable ctx (an RPC's) that would register a child with it, start a
// timer for its cancel and unregister it again, for every call.
func (p *pipeline) run(ctx context.Context, timeout time.Duration, sc, batch *goredis.Script, keys []string, args []any, late func(reply any)) (any, error) {
	c := &scriptCall{ctx: ctx, deadline: time.Now().Add(timeout), script: sc, batch: batch, keys: keys, args: args, late: late, done: make(chan struct{})}
	if batch != nil && p.cluster && len(keys) > 0 {
		c.group = hashTag(keys[0])
	}
	return p.call(c, timeout)
}

// runPlain queues the plain command cmd, whose only key is key, and waits
// for its reply as run does (late as well): in the pipeline beside the
// script calls, after every call queued before it.
func (p *pipeline) runPlain(ctx context.Context, timeout time.Duration, late func(reply any), key string, cmd ...any) (any, error) {
	c := &scriptCall{ctx: ctx, deadline: time.Now().Add(timeout), keys: []string{key}, plain: cmd, late: late, done: make(chan struct{})}
	return p.call(c, timeout)
}

// runPlainThen is runPlain of cmd followed by the commands then, on keys
// of key's slot, in the same round trip and in that order. Its reply is
// []any{cmd's reply, then's replies...}, where a nil reply (goredis.Nil)
// is nil; another error of any command is the call's error.
func (p *pipeline) runPlainThen(ctx context.Context, timeout time.Duration, late func(reply any), key string, cmd []any, then ...[]any) (any, error) {
	c := &scriptCall{ctx: ctx, deadline: time.Now().Add(timeout), keys: []string{key}, plain: cmd, then: then, late: late, done: make(chan struct{})}
	return p.call(c, timeout)
}

// call queues c and waits for its outcome, at most timeout.
func (p *pipeline) call(c *scriptCall, timeout time.Duration) (any, error) {
	ctx := c.ctx
	select {
	case <-p.stop:
		return nil, goredis.ErrClosed
	default:
	}
	expired := time.NewTimer(timeout)
	defer expired.Stop()
	c.gap = p.arrived()
	defer p.pending.Add(-1)
	select {
	case p.queue <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-expired.C:
		return nil, p.missed()
	case <-p.stop:
		return nil, goredis.ErrClosed
	}
	var err error
	select {
	case <-c.done:
		return c.reply, c.err
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired.C:
		err = p.missed()
	case <-p.stop:
		// Enqueued as the pipeline closed: nobody may be left to answer.
		err = goredis.ErrClosed
	}
	if !c.leave() {
		// The outcome came as the caller was leaving: it is the answer.
		<-c.done
		return c.reply, c.err
	}
	return nil, err
}

// missed is the error of a call whose deadline passed before its outcome
// came: context.DeadlineExceeded when Redis has left a command unanswered
// for a good part of the call timeout (Redis is late: the breaker counts
// it, and the policy's failure mode answers), else an error wrapping
// node.ErrOverloaded (the call waited inside the node while Redis
// answered).
func (p *pipeline) missed() error { return p.live.missed(p.callTimeout) }

// close stops the pipeliners; calls still queued fail with ErrClosed. It
// may be called more than once.
func (p *pipeline) close() {
	p.stopped.Do(func() { close(p.stop) })
	p.wg.Wait()
	for {
		select {
		case c := <-p.queue:
			c.err = goredis.ErrClosed
			c.finish()
		default:
			return
		}
	}
}

func (p *pipeline) loop() {
	defer p.wg.Done()
	batch := make([]*scriptCall, 0, maxPipeline)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.tokens:
		}
		select {
		case <-p.stop:
			return
		case <-p.taking:
		}
		var ok bool
		batch, ok = p.gather(batch[:0], timer)
		p.taking <- struct{}{}
		if !ok {
			return
		}
		start := time.Now()
		// A round trip that takes longer than a call should wait for a
		// pipeliner (a stalled Redis, a starved process) does not hold
		// back the calls behind it: it lets one more pipeliner take them.
		overdue := time.AfterFunc(p.callTimeout/activeShare, p.grow)
		sent := p.send(batch)
		overdue.Stop()
		p.adapt(sent, time.Since(start))
		clear(batch) // drop references so finished calls can be collected
	}
}

// send runs batch as one pipeline of EVALSHAs (calls that may share a
// batch script call share one), resends the calls it got a Cluster
// redirection for, then runs the calls that met NOSCRIPT again as EVALs
// (which load their script), and delivers every outcome. It reports
// whether anything went to Redis.
func (p *pipeline) send(batch []*scriptCall) bool {
	live := batch[:0:0]
	now := time.Now()
	var missed error
	for _, c := range batch {
		err := c.ctx.Err()
		if err == nil && !now.Before(c.deadline) {
			// Its caller is leaving, or about to, with the same verdict.
			if missed == nil {
				missed = p.missed()
			}
			err = missed
		}
		if err != nil {
			c.err = err
			c.finish()
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.netTimeout)
	defer cancel()
	wire := wireCalls(live)
	for _, w := range wire {
		if w.plain != nil {
			p.plain.Add(1)
		} else {
			p.scripts.Add(1)
		}
	}
	p.roundTrips.Add(1)
	cmds := p.exec(ctx, wire, func(s commander, w *wireCall) *goredis.Cmd {
		if w.plain != nil {
			first := s.Do(ctx, w.plain...)
			w.thenCmds = w.thenCmds[:0]
			for _, c := range w.then {
				w.thenCmds = append(w.thenCmds, s.Do(ctx, c...))
			}
			return first
		}
		return w.script.EvalSha(ctx, s, w.keys, w.args...)
	})
	var missing []*wireCall
	pace := &pacer{chunk: p.wakeChunk}
	for i, w := range wire {
		if err := cmds[i].Err(); err != nil && isNoScript(err) {
			missing = append(missing, w)
			continue
		}
		w.deliver(cmds[i], pace)
	}
	if len(missing) == 0 {
		return true
	}
	p.reloadInBackground()
	cmds = p.exec(ctx, missing, func(s commander, w *wireCall) *goredis.Cmd {
		return w.script.Eval(ctx, s, w.keys, w.args...)
	})
	for i, w := range missing {
		w.deliver(cmds[i], pace)
	}
	return true
}
