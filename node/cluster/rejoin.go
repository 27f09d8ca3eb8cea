package cluster

import (
	"context"
	"time"

	"github.com/quotad/quotad/node"
)

// This file is the rejoin loop, which heals partitions by contacting the
// seeds and the dead members this node does not see alive.

// rejoinLoop joins the seeds at once, then every RejoinInterval re-joins
// seeds and dead members that this node does not see alive, until ctx
// ends. memberlist stops contacting a member once it is declared dead, so
// after a partition each side would go on alone; contacting the other
// side's addresses merges the two views again.
func (m *Membership) rejoinLoop(ctx context.Context) {
	defer m.loops.Done()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if targets := m.rejoinTargets(ctx); len(targets) > 0 {
			if _, err := m.join(ctx, targets); err != nil {
				m.log.Debug("cluster: rejoin found nobody", "targets", targets, "err", err)
			}
		}
		wait := m.cfg.RejoinInterval
		if m.Size() == 1 && len(m.cfg.Join) > 0 {
			// Alone although told of seeds: they are probably starting
			// too; try again soon rather than one interval later.
			wait = min(wait, time.Second)
		}
		t.Reset(wait)
	}
}

// rejoinTargets lists the addresses to contact: the seeds' and recently
// dead members', minus those of live members and this node. It forgets
// members that departed more than ForgetDeadAfter ago.
func (m *Membership) rejoinTargets(ctx context.Context) []string {
	var seeds []string
	for _, s := range m.cfg.Join {
		seeds = append(seeds, m.expand(ctx, s)...)
	}
	skip := map[string]bool{m.Addr(): true}
	var dead []string
	now := time.Now()
	m.mu.Lock()
	for name, mb := range m.members {
		switch {
		case mb.State == node.MemberAlive:
			skip[mb.Addr] = true
		case now.Sub(mb.Since) > m.cfg.ForgetDeadAfter:
			delete(m.members, name)
			delete(m.gossipIDs, name)
		case mb.State == node.MemberDead:
			dead = append(dead, mb.Addr)
		}
	}
	m.mu.Unlock()
	var out []string
	for _, a := range append(seeds, dead...) {
		if !skip[a] {
			skip[a] = true
			out = append(out, a)
		}
	}
	return out
}
