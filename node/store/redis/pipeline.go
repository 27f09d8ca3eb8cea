package redis

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
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
	// its arguments, whose only key is keys[0].
	plain []any
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

// wireCall is one command a pipeline sends: one queued call (an EVALSHA
// or a plain command), or several calls of one batch script (members, in
// queue order).
type wireCall struct {
	script  *goredis.Script
	plain   []any
	keys    []string
	args    []any
	members []*scriptCall
	// keyBytes is the length of the members' keys, together.
	keyBytes int
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
	// plain commands (Store.FreshWrites), roundTrips the pipelines that
	// carried them (Store.RoundTrips), waited the batches that waited for
	// company.
	scripts, plain, roundTrips, waited atomic.Int64
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

// arrived notes that a call is being queued now, for the smoothed gap
// between calls, and returns the time since the call before it (-1 for
// the first call).
func (p *pipeline) arrived() time.Duration {
	seen := p.pending.Add(1) - 1
	if p.window <= 0 {
		return -1
	}
	o := p.others.Load()
	p.others.Store(o + (seen*companyScale-o)/gapWeight)
	now := int64(time.Since(p.epoch))
	last := p.lastCall.Swap(now)
	if last == 0 {
		return -1
	}
	d := min(now-last, gapCap*int64(p.window))
	g := p.gap.Load()
	p.gap.Store(g + (d-g)/gapWeight)
	return time.Duration(d)
}

// gather waits for a call, takes it and whatever else is queued (up to
// maxPipeline), and, while calls come faster than one per window and
// beside others (not one caller calling back to back), waits for more:
// until the batch is full, the window since the first call has passed, or
// no call has come for quietGaps usual gaps. A call that came after a
// pause of more than a window goes at once, and a batch holding a call
// whose deadline is near (it queued behind a slow Redis, or its caller
// allowed it little time) goes as soon as that call is in it, so a quiet
// node never waits and a wait never costs a call its deadline. It reports
// false if the pipeline stopped first.
func (p *pipeline) gather(batch []*scriptCall, timer *time.Timer) ([]*scriptCall, bool) {
	select {
	case <-p.stop:
		return batch, false
	case c := <-p.queue:
		batch = append(batch, c)
	}
	first := time.Now()
	batch = p.drain(batch)
	if p.window <= 0 || len(batch) >= maxPipeline {
		return batch, true
	}
	gap := time.Duration(p.gap.Load())
	if c := batch[0]; gap <= 0 || gap >= p.window || c.gap < 0 || c.gap >= p.window || p.others.Load() < companyScale/2 {
		return batch, true
	}
	if p.urgent(batch, first) {
		return batch, true
	}
	p.waited.Add(1)
	end := first.Add(p.window)
	for len(batch) < maxPipeline {
		wait := min(time.Until(end), quietGaps*gap)
		if wait <= 0 {
			break
		}
		timer.Reset(wait)
		select {
		case c := <-p.queue:
			timer.Stop()
			n := len(batch)
			batch = p.drain(append(batch, c))
			if p.urgent(batch[n:], time.Now()) {
				return batch, true
			}
			continue
		case <-timer.C:
		case <-p.stop:
			timer.Stop()
		}
		break
	}
	return batch, true
}

// urgent reports whether any of calls has, at now, less time left than
// two windows and two smoothed round trips: such a call must not wait for
// company. On a Redis whose round trips take a good part of the call
// timeout, no call waits.
func (p *pipeline) urgent(calls []*scriptCall, now time.Time) bool {
	margin := 2*p.window + 2*time.Duration(p.lastRTT.Load())
	for _, c := range calls {
		if c.deadline.Sub(now) < margin {
			return true
		}
		if d, ok := c.ctx.Deadline(); ok && d.Sub(now) < margin {
			return true
		}
	}
	return false
}

// drain adds to batch whatever is queued, up to maxPipeline calls.
func (p *pipeline) drain(batch []*scriptCall) []*scriptCall {
	for len(batch) < maxPipeline {
		select {
		case c := <-p.queue:
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}

// wantActive is how many pipeliners should take calls when round trips
// take rtt: enough that a call waits for a busy one at most about
// 1/activeShare of its timeout.
func (p *pipeline) wantActive(rtt time.Duration) int {
	share := max(p.callTimeout/activeShare, time.Millisecond)
	return min(pipeliners, max(minActive, int((pipeliners*rtt+share-1)/share)))
}

// adapt hands back the token of a pipeliner that finished a round trip of
// rtt (sent: it reached Redis) and sets the tokens in circulation to what
// the smoothed round trip calls for, one fewer at a time.
func (p *pipeline) adapt(sent bool, rtt time.Duration) {
	give := 1
	p.mu.Lock()
	if sent {
		if p.rtt == 0 {
			p.rtt = rtt
		} else {
			p.rtt += (rtt - p.rtt) / 4
		}
		p.lastRTT.Store(int64(p.rtt))
		switch want := p.wantActive(p.rtt); {
		case p.active > want:
			p.active--
			give = 0
		case p.active < want:
			give += want - p.active
			p.active = want
		}
	}
	p.mu.Unlock()
	// Never blocks: at most pipeliners tokens exist.
	for range give {
		p.tokens <- struct{}{}
	}
}

// roomForTwo reports whether the smoothed round trip leaves room for two
// in timeout, each with as much again to spare for queueing: a check that
// may need a second round trip (a fresh write that finds state) can then
// still meet its deadline. Before the first round trip it reports true.
func (p *pipeline) roomForTwo(timeout time.Duration) bool {
	return 4*time.Duration(p.lastRTT.Load()) < timeout
}

// grow lets one more pipeliner take calls, if one is left.
func (p *pipeline) grow() {
	p.mu.Lock()
	more := p.active < pipeliners
	if more {
		p.active++
	}
	p.mu.Unlock()
	if more {
		p.tokens <- struct{}{}
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
			return s.Do(ctx, w.plain...)
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

// wireCalls groups calls into the commands that send them: calls of one
// batch script and group share one call of it (up to
// algorithms.MaxBatchChecks calls and algorithms.MaxBatchKeyBytes of keys
// each, in queue order); a call left alone, or without a batch form, goes
// as itself. A plain call closes every batch call open before it, so that
// a script call queued after it, for its key, also runs after it.
func wireCalls(calls []*scriptCall) []*wireCall {
	type groupKey struct {
		batch *goredis.Script
		group string
	}
	wire := make([]*wireCall, 0, len(calls))
	var open map[groupKey]*wireCall
	for _, c := range calls {
		if c.plain != nil {
			wire = append(wire, &wireCall{plain: c.plain, keys: c.keys, members: []*scriptCall{c}})
			clear(open)
			continue
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
