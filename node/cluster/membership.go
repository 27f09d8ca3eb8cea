package cluster

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/quotad/quotad/node"
)

// This file is a membership's life: New starts memberlist and the loops,
// Join contacts seeds, Leave, Shutdown and Close end it.

// Membership is this node's membership in a quotad cluster, on
// hashicorp/memberlist: who is alive (for lease caps and status pages),
// the gossip of denials and resets, and the rejoin loop that heals
// partitions. New starts it; Close leaves gracefully. All methods
// are safe for concurrent use.
type Membership struct {
	cfg  Config
	log  *slog.Logger
	name string // this node's name, fixed before memberlist starts
	// addr and port are this node's advertised address, read once:
	// memberlist's LocalNode hands out a pointer it later writes to.
	addr   string
	port   int
	ml     *memberlist.Memberlist
	gossip *gossip
	// fp is this node's fingerprint, advertised in its metadata.
	fp fingerprint
	// leaving is set just before a graceful leave, so that the last alive
	// message this node sends tells the others it is leaving, not dying.
	leaving atomic.Bool

	// size is the number of live members, this node included: the
	// lease-cap divisor, read on every store call.
	size atomic.Int64
	mu   sync.Mutex // guards members
	// members holds every member seen, live or departed; departed ones are
	// dropped after ForgetDeadAfter.
	members map[string]node.Member

	joinAttempts, joinContacts, refused atomic.Int64
	// refusedMu guards refusedAt: when each refused peer was last logged.
	refusedMu sync.Mutex
	refusedAt map[string]time.Time
	// gossipIDs are the members' gossip ids by name; guarded by mu.
	gossipIDs map[string]uint64

	// peers are the live members but this node, copied out of memberlist's
	// events for the gossip sender.
	peers atomic.Pointer[[]*memberlist.Node]
	// spreadFanout is how many random members a spread packet goes to
	// each round (spread.go): gossipFanout, unless a test sets another.
	spreadFanout atomic.Int32

	stopLoops context.CancelFunc
	loops     sync.WaitGroup
	// closeMu orders Leave and Shutdown: memberlist panics on a leave after
	// shutdown.
	closeMu sync.Mutex
	left    bool
	down    bool
	// closing is set as Shutdown closes memberlist, which stops its own
	// gossip timers only after closing its sockets: a send in between fails
	// with "use of closed network connection", which is no error then.
	closing atomic.Bool
}

// New starts this node's gossip on cfg's address and a loop that
// joins the seeds in the background and keeps re-joining them and dead
// members. It returns once the gossip listener is up; joining is not
// awaited (see Size and Join). log may be nil (discard); memberlist's own
// log lines go to it too, at their levels.
func New(cfg Config, log *slog.Logger) (*Membership, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Membership{
		cfg: cfg, log: log, members: make(map[string]node.Member), gossipIDs: make(map[string]uint64),
		refusedAt: make(map[string]time.Time), fp: newFingerprint(cfg.KeyPrefix, cfg.StoreID),
	}
	m.gossip = newGossip(log, newGossipID(), cfg.GossipMaxAge)
	m.gossip.spreadIn(m.Size, cfg.gossipInterval())
	m.spreadFanout.Store(gossipFanout)
	mc, err := m.memberlistConfig()
	if err != nil {
		return nil, err
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		if cfg.Transport == nil {
			_ = mc.Transport.Shutdown()
		}
		return nil, fmt.Errorf("cluster: start gossip on %s: %w", cfg.BindAddr, err)
	}
	m.ml = ml
	self := ml.LocalNode()
	m.addr, m.port = self.Address(), int(self.Port)
	ctx, cancel := context.WithCancel(context.Background())
	m.stopLoops = cancel
	m.loops.Add(2)
	go m.rejoinLoop(ctx)
	go m.gossipLoop(ctx)
	return m, nil
}

// hostname is os.Hostname, a variable for the test of its failure.
var hostname = os.Hostname

// memberlistConfig translates m.cfg into memberlist's configuration,
// starting from its LAN defaults.
func (m *Membership) memberlistConfig() (*memberlist.Config, error) {
	c := m.cfg
	mc := memberlist.DefaultLANConfig()
	mc.Logger = log.New(&memberlistLog{log: m.log, closing: &m.closing}, "", 0)
	var advertiseIP string
	advertisePort := 0
	if c.AdvertiseAddr != "" {
		host, port, _ := splitAddr(c.AdvertiseAddr, false) // validated
		ip, err := m.resolveOne(host)
		if err != nil {
			return nil, fmt.Errorf("cluster advertise address: %w", err)
		}
		advertiseIP, advertisePort = ip, port
	}
	if c.Transport != nil {
		mc.Transport = c.Transport
	} else {
		host, port, _ := splitAddr(c.BindAddr, false) // validated
		if host == "" {
			host = "0.0.0.0"
		}
		// Our transport, not memberlist's NetTransport (transport.go says
		// why); a port of 0 is the one it took.
		t, err := newNetTransport(host, port, mc.Logger)
		if err != nil {
			return nil, fmt.Errorf("cluster: start gossip on %s: %w", c.BindAddr, err)
		}
		mc.Transport = t
		mc.BindAddr, mc.BindPort, mc.AdvertisePort = host, t.port(), t.port()
	}
	if advertiseIP != "" {
		mc.AdvertiseAddr, mc.AdvertisePort = advertiseIP, advertisePort
	}
	mc.Name = c.NodeName
	if mc.Name == "" {
		hostname, err := hostname()
		if err != nil {
			if c.Transport == nil {
				_ = mc.Transport.Shutdown() // ours, listening: New fails
			}
			return nil, fmt.Errorf("cluster node name: none given and %w", err)
		}
		mc.Name = net.JoinHostPort(hostname, strconv.Itoa(mc.AdvertisePort))
	}
	m.name = mc.Name
	mc.SecretKey = c.SecretKey
	// memberlist's LZW compression allocates a 72 KB writer for every
	// message it sends (most of a quiet node's allocations), to shrink
	// packets that are small anyway: quotad's gossip fits its 1400-byte
	// packets uncompressed (maxGossipPacket). Peers decode compressed and
	// uncompressed messages alike.
	mc.EnableCompression = false
	mc.ProbeInterval = c.probeInterval()
	mc.ProbeTimeout = mc.ProbeInterval / 2
	mc.SuspicionMult = 4
	mc.GossipInterval = c.gossipInterval()
	// Scaled from memberlist's LAN defaults (30s each at DeadAfter 5s).
	mc.GossipToTheDeadTime = 2 * c.DeadAfter
	mc.PushPullInterval = 6 * c.DeadAfter
	mc.TCPTimeout = c.DeadAfter
	// A restarted node keeps its name but may come back at a new address
	// (a Kubernetes pod gets a new IP).
	mc.DeadNodeReclaimTime = c.DeadAfter
	mc.Delegate = delegate{m}
	mc.Events = events{m}
	mc.Alive = guard{m}
	mc.Merge = guard{m}
	return mc, nil
}

// resolveOne returns host if it is an IP address, else its first address.
func (m *Membership) resolveOne(host string) (string, error) {
	if net.ParseIP(host) != nil {
		return host, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.DeadAfter)
	defer cancel()
	addrs, err := m.cfg.LookupHost(ctx, host)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return "", fmt.Errorf("resolve %s: no addresses", host)
	}
	return addrs[0], nil
}

// Name is this node's name in the cluster.
func (m *Membership) Name() string { return m.name }

// Addr is this node's advertised gossip address, "host:port".
func (m *Membership) Addr() string { return m.addr }

// Size is the number of live members, this node included (at least 1).
// It does not block and is cheap enough for every store call.
func (m *Membership) Size() int { return max(1, int(m.size.Load())) }

// Members returns every member this node knows of, sorted by name: the
// live ones and those that died or left within ForgetDeadAfter.
func (m *Membership) Members() []node.Member {
	m.mu.Lock()
	out := make([]node.Member, 0, len(m.members))
	for _, mb := range m.members {
		out = append(out, mb)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Stats returns the rejoin loop's and the gossip's counters.
func (m *Membership) Stats() node.MembershipStats {
	return node.MembershipStats{
		JoinAttempts: m.joinAttempts.Load(),
		JoinContacts: m.joinContacts.Load(),
		Refused:      m.refused.Load(),
		Gossip:       m.gossip.stats(),
	}
}

// Join contacts the given addresses now ("host:port" or "host", DNS names
// expanded as for Config.Join) and merges their view of the
// cluster into this node's. It returns how many answered; an error means
// none did (wrong key, unreachable, refused). The rejoin loop calls it;
// callers need not.
func (m *Membership) Join(ctx context.Context, addrs ...string) (int, error) {
	var targets []string
	for _, a := range addrs {
		targets = append(targets, m.expand(ctx, a)...)
	}
	if len(targets) == 0 {
		return 0, fmt.Errorf("cluster join: no addresses to contact in %q", addrs)
	}
	return m.join(ctx, targets)
}

// join contacts every target concurrently and reports how many answered.
// It returns early when ctx ends: a contact to an address that swallows
// packets takes a whole stream timeout (DeadAfter), and shutting down
// should not wait for it; such a contact finishes on its own.
func (m *Membership) join(ctx context.Context, targets []string) (int, error) {
	results := make(chan error, len(targets))
	for _, t := range targets {
		go func() {
			m.joinAttempts.Add(1)
			_, err := m.ml.Join([]string{t})
			if err == nil {
				m.joinContacts.Add(1)
			}
			results <- err
		}()
	}
	var (
		contacts int
		errs     []error
	)
	for range targets {
		select {
		case err := <-results:
			if err != nil {
				errs = append(errs, err)
			} else {
				contacts++
			}
		case <-ctx.Done():
			return contacts, fmt.Errorf("cluster join: %w", ctx.Err())
		}
	}
	if contacts > 0 {
		return contacts, nil
	}
	return 0, fmt.Errorf("cluster join: %w", errors.Join(errs...))
}

// expand turns a seed into "ip:port" addresses: an IP stays, a name
// becomes each address it resolves to. A seed without a port gets this
// node's gossip port. A failed lookup is logged and expands to nothing.
func (m *Membership) expand(ctx context.Context, seed string) []string {
	host, port, err := splitAddr(seed, true)
	if err != nil {
		m.log.Warn("cluster: bad seed address", "seed", seed, "err", err)
		return nil
	}
	if port == 0 {
		port = m.port
	}
	p := strconv.Itoa(port)
	if net.ParseIP(host) != nil {
		return []string{net.JoinHostPort(host, p)}
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.DeadAfter)
	defer cancel()
	ips, err := m.cfg.LookupHost(ctx, host)
	if err != nil {
		m.log.Warn("cluster: cannot resolve seed", "seed", seed, "err", err)
		return nil
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = net.JoinHostPort(ip, p)
	}
	return out
}

// Leave tells the other members that this node is leaving, so they stop
// counting it at once instead of after DeadAfter, waiting up to timeout
// for the message to go out. The node keeps gossiping until Shutdown.
// Calls after the first, or after Shutdown, do nothing.
func (m *Membership) Leave(timeout time.Duration) error {
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	if m.left || m.down {
		return nil
	}
	m.left = true
	// Re-advertise first with the leaving mark in the metadata: memberlist
	// tells the others "left" and "dead" apart internally but not through
	// its API, so the mark is how they record a graceful leave.
	m.leaving.Store(true)
	if err := m.ml.UpdateNode(timeout); err != nil {
		m.log.Debug("cluster: announcing the leave", "err", err)
	}
	if err := m.ml.Leave(timeout); err != nil {
		return fmt.Errorf("cluster leave: %w", err)
	}
	return nil
}

// Shutdown stops gossiping and the rejoin loop without telling anyone, as
// a crash would; the others declare this node dead after DeadAfter. Call
// Leave first for a graceful exit. Calls after the first do nothing; a nil
// Membership is a no-op, so a standalone node can call it unconditionally.
func (m *Membership) Shutdown() error {
	if m == nil {
		return nil
	}
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	if m.down {
		return nil
	}
	m.down = true
	m.stopLoops()
	m.loops.Wait()
	m.closing.Store(true)
	if err := m.ml.Shutdown(); err != nil {
		return fmt.Errorf("cluster shutdown: %w", err)
	}
	return nil
}

// Close leaves gracefully (waiting a few gossip rounds for the word to
// go out) and shuts down. A nil Membership is a no-op.
func (m *Membership) Close() error {
	if m == nil {
		return nil
	}
	leaveErr := m.Leave(leaveTimeout(m.cfg))
	return errors.Join(leaveErr, m.Shutdown())
}

// leaveTimeout is how long Close waits for the leave to go out: a few
// gossip rounds, since memberlist retransmits it several times.
func leaveTimeout(c Config) time.Duration {
	return max(time.Second, 10*c.gossipInterval())
}

// Describe says what this member is and whom it joins, for the startup
// banner and logs.
func (m *Membership) Describe() string {
	s := fmt.Sprintf("node %s gossiping on %s", m.Name(), m.Addr())
	if m.cfg.SecretKey != nil {
		s += " (encrypted)"
	} else {
		s += " (plaintext)"
	}
	if len(m.cfg.Join) > 0 {
		s += ", joining " + strings.Join(m.cfg.Join, ",")
	}
	return s
}
