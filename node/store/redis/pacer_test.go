package redis

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The bulk pipeline wakes a round trip's callers a chunk at a time and
// yields its processor between chunks, so that what became ready meanwhile
// (and the callers already woken) runs before the rest are woken. On one
// processor: with no chunk, no caller runs before all 64 are woken; with
// bulkWakeChunk, the first callers run after the first chunk or so.
func TestPacedDeliveryYieldsBetweenChunks(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const n = 64
	firstRunSaw := func(chunk int) int64 {
		wire := make([]*wireCall, n)
		cmds := make([]*goredis.Cmd, n)
		var delivered atomic.Int64
		saw := make(chan int64, n)
		var blocked, ran sync.WaitGroup
		for i := range wire {
			c := &scriptCall{done: make(chan struct{})}
			wire[i] = &wireCall{members: []*scriptCall{c}}
			cmds[i] = goredis.NewCmd(context.Background())
			cmds[i].SetVal(int64(i))
			blocked.Add(1)
			ran.Add(1)
			go func() {
				defer ran.Done()
				blocked.Done()
				<-c.done
				saw <- delivered.Load()
			}()
		}
		blocked.Wait()
		time.Sleep(10 * time.Millisecond) // every caller is waiting on its done
		pace := &pacer{chunk: chunk}
		for i, w := range wire {
			w.deliver(cmds[i], pace)
			delivered.Add(1)
		}
		ran.Wait()
		close(saw)
		first := int64(n)
		for d := range saw {
			first = min(first, d)
		}
		return first
	}
	// Up to three tries each: on a loaded machine the runtime may preempt
	// the delivering goroutine (its thread descheduled for 10 ms), which
	// lets callers run early without a yield.
	var unpaced int64
	for range 3 {
		if unpaced = max(unpaced, firstRunSaw(0)); unpaced == n {
			break
		}
	}
	if unpaced != n {
		t.Errorf("without a chunk, the first caller ran after %d of %d were woken, want all", unpaced, n)
	}
	// The scheduler runs the global queue, where a yielding goroutine goes,
	// first on one pass in 61: the pipeliner may then wake one more chunk
	// before the callers run.
	paced := int64(n)
	for range 3 {
		if paced = min(paced, firstRunSaw(bulkWakeChunk)); paced <= 2*bulkWakeChunk {
			break
		}
	}
	if paced > 2*bulkWakeChunk {
		t.Errorf("with chunks of %d, the first caller ran after %d of %d were woken, want at most %d", bulkWakeChunk, paced, n, 2*bulkWakeChunk)
	}
}
