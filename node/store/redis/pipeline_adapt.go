package redis

import "time"

// This file is how many pipeliners take calls: as many as the round trip
// needs so that a call waits for a busy one at most a share of its
// timeout, adapted to each round trip's time.

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
