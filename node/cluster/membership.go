package node

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Defaults of MembershipConfig.
const (
	// DefaultDeadAfter is how long a member that stopped answering stays
	// counted: memberlist then probes every 500ms.
	DefaultDeadAfter = 5 * time.Second
	// DefaultRejoinInterval is how often the rejoin loop contacts seeds and
	// dead members that are not in this node's view.
	DefaultRejoinInterval = 10 * time.Second
	// DefaultForgetDeadAfter is how long the rejoin loop keeps trying the
	// address of a member that died.
	DefaultForgetDeadAfter = 10 * time.Minute
	// MinDeadAfter is the smallest DeadAfter: memberlist then probes every
	// 10ms, about as fast as a loopback test can keep up with.
	MinDeadAfter = 100 * time.Millisecond
	// DefaultGossipMaxAge is how far a gossip packet's send time may lie
	// from the receiver's clock: members' clocks must agree that well.
	DefaultGossipMaxAge = 10 * time.Second
	// MinGossipMaxAge is the smallest GossipMaxAge.
	MinGossipMaxAge = 100 * time.Millisecond
)

// MembershipConfig configures this node's membership in a quotad cluster.
// The zero value is not valid: BindAddr (or, in tests, Transport) is
// required. Build it, then NewMembership applies defaults and validates.
type MembershipConfig struct {
	// NodeName names this node to the others; unique in the cluster.
	// Default "<hostname>:<gossip port>".
	NodeName string
	// BindAddr is the gossip address, "host:port" (UDP and TCP on the same
	// port); host is an IP address, or empty for every interface. Ignored
	// when Transport is set.
	BindAddr string
	// AdvertiseAddr is the "host:port" the other nodes reach this one at,
	// when it differs from BindAddr (NAT, containers); host is an IP or a
	// name resolved once at start. Default: BindAddr's, or this host's
	// private IP when bound to every interface.
	AdvertiseAddr string
	// Join lists seeds, "host:port" or "host" (then the port is this
	// node's gossip port). A host that is a DNS name stands for every
	// address it resolves to — a Kubernetes headless service names every
	// pod. Seeds are resolved again on each rejoin. Empty: this node waits
	// for others to join it.
	Join []string
	// SecretKey encrypts and authenticates all gossip (AES-GCM); 16, 24 or
	// 32 bytes for AES-128, -192 or -256. Every node needs the same key; a
	// node with another key, or none, is refused. nil: plaintext gossip,
	// which anyone who reaches the address can read, join and forge
	// (received denials are still held to what their limit can justify);
	// cmd/quotad allows it only with --cluster-insecure.
	SecretKey []byte
	// KeyPrefix and StoreID name the data this node limits: its Redis key
	// prefix, and the Redis it limits on (cmd/quotad: the address and
	// database of one server, the master name of a Sentinel set or the
	// seeds of a Cluster; never credentials, as it appears in logs). Members
	// advertise a hash of each and refuse, with a log line saying which
	// differs, a peer whose either differs: its denials and resets would
	// apply to other counters. Empty values are values like any other.
	KeyPrefix, StoreID string
	// GossipMaxAge is how far from this node's clock a gossip packet's
	// send time may lie; older (or newer) packets are dropped as stale, so
	// a captured packet cannot be played back later. Members' clocks must
	// agree within it (NTP does far better). Default DefaultGossipMaxAge;
	// at least MinGossipMaxAge.
	GossipMaxAge time.Duration
	// DeadAfter is how long after a member stops answering the others
	// declare it dead and stop counting it, for clusters of up to about ten
	// nodes (memberlist probes every DeadAfter/10 and suspects a member for
	// four probe intervals, scaled by log10 of the cluster size beyond
	// ten). It also bounds the stream timeout. Default DefaultDeadAfter; at
	// least MinDeadAfter.
	DeadAfter time.Duration
	// RejoinInterval is how often this node re-joins seeds and dead
	// members it does not see as alive, which heals partitions (memberlist
	// never contacts a dead member again by itself). While the node sees no
	// other member it retries every second at most. Default
	// DefaultRejoinInterval.
	RejoinInterval time.Duration
	// ForgetDeadAfter is how long the rejoin loop keeps trying a dead
	// member's address. Default DefaultForgetDeadAfter.
	ForgetDeadAfter time.Duration
	// Transport replaces memberlist's UDP and TCP transport (tests use an
	// in-memory network); nil uses the network at BindAddr.
	Transport memberlist.NodeAwareTransport
	// LookupHost resolves a seed's or the advertise address's host name to
	// addresses; nil uses net.DefaultResolver.LookupHost.
	LookupHost func(ctx context.Context, host string) ([]string, error)
}

// probeInterval is memberlist's ProbeInterval for c (after defaults).
func (c MembershipConfig) probeInterval() time.Duration { return c.DeadAfter / 10 }

// gossipInterval is how often queued gossip goes out when it cannot
// piggyback on probes: memberlist's default, or faster with fast probes.
func (c MembershipConfig) gossipInterval() time.Duration {
	return min(200*time.Millisecond, c.probeInterval())
}

func (c MembershipConfig) withDefaults() MembershipConfig {
	if c.DeadAfter == 0 {
		c.DeadAfter = DefaultDeadAfter
	}
	if c.RejoinInterval == 0 {
		c.RejoinInterval = DefaultRejoinInterval
	}
	if c.ForgetDeadAfter == 0 {
		c.ForgetDeadAfter = DefaultForgetDeadAfter
	}
	if c.LookupHost == nil {
		c.LookupHost = net.DefaultResolver.LookupHost
	}
	if c.GossipMaxAge == 0 {
		c.GossipMaxAge = DefaultGossipMaxAge
	}
	return c
}

// Validate reports the first problem with c, with defaults applied to
// unset fields, naming the field.
func (c MembershipConfig) Validate() error {
	c = c.withDefaults()
	if c.Transport == nil {
		if c.BindAddr == "" {
			return fmt.Errorf("cluster bind address: %w: required (host:port)", ErrInvalidConfig)
		}
		host, _, err := splitAddr(c.BindAddr, false)
		if err != nil {
			return fmt.Errorf("cluster bind address: %w", err)
		}
		if host != "" && net.ParseIP(host) == nil {
			return fmt.Errorf("cluster bind address: %w: %q is not an IP address (bind to an IP, or leave the host empty for every interface)", ErrInvalidConfig, host)
		}
	}
	if c.AdvertiseAddr != "" {
		if host, _, err := splitAddr(c.AdvertiseAddr, false); err != nil {
			return fmt.Errorf("cluster advertise address: %w", err)
		} else if host == "" {
			return fmt.Errorf("cluster advertise address: %w: %q has no host", ErrInvalidConfig, c.AdvertiseAddr)
		}
	}
	for i, s := range c.Join {
		if host, _, err := splitAddr(s, true); err != nil {
			return fmt.Errorf("join[%d]: %w", i, err)
		} else if host == "" {
			return fmt.Errorf("join[%d]: %w: %q has no host", i, ErrInvalidConfig, s)
		}
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		return fmt.Errorf("cluster key: %w: %d bytes; want 16, 24 or 32", ErrInvalidConfig, len(c.SecretKey))
	}
	switch {
	case c.DeadAfter < MinDeadAfter:
		return fmt.Errorf("cluster dead after: %w: %s must be at least %s", ErrInvalidConfig, c.DeadAfter, MinDeadAfter)
	case c.RejoinInterval < 0:
		return fmt.Errorf("cluster rejoin interval: %w: %s must be > 0", ErrInvalidConfig, c.RejoinInterval)
	case c.ForgetDeadAfter < 0:
		return fmt.Errorf("cluster forget dead after: %w: %s must be > 0", ErrInvalidConfig, c.ForgetDeadAfter)
	case c.GossipMaxAge < MinGossipMaxAge:
		return fmt.Errorf("cluster gossip max age: %w: %s must be at least %s", ErrInvalidConfig, c.GossipMaxAge, MinGossipMaxAge)
	}
	return nil
}

// splitAddr splits "host:port". With portOptional, a bare host (no colon)
// returns port 0, meaning this node's gossip port.
func splitAddr(s string, portOptional bool) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		if portOptional && !strings.Contains(s, ":") && s != "" {
			return s, 0, nil
		}
		return "", 0, fmt.Errorf("%w: %q is not host:port", ErrInvalidConfig, s)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, fmt.Errorf("%w: port %q of %q must be 1 to 65535", ErrInvalidConfig, p, s)
	}
	return h, n, nil
}

// MemberState is what this node believes about a member.
type MemberState int

const (
	// MemberAlive answers probes, or failed some recently and has not yet
	// been declared dead (memberlist does not expose suspicion).
	MemberAlive MemberState = iota + 1
	// MemberDead stopped answering for DeadAfter, or was cut off by a
	// partition; the rejoin loop keeps trying its address.
	MemberDead
	// MemberLeft left the cluster on purpose (a graceful shutdown).
	MemberLeft
)

// String returns "alive", "dead" or "left".
func (s MemberState) String() string {
	switch s {
	case MemberAlive:
		return "alive"
	case MemberDead:
		return "dead"
	case MemberLeft:
		return "left"
	}
	return fmt.Sprintf("MemberState(%d)", int(s))
}

// Member is one node of the cluster as this node sees it.
type Member struct {
	// Name is the member's node name; Addr its gossip "host:port".
	Name, Addr string
	State      MemberState
	// Self marks this node.
	Self bool
	// Since is when this node last saw the member change state (joined,
	// died or left).
	Since time.Time
}

// MembershipStats counts the rejoin loop's work, refused peers and the
// gossip.
type MembershipStats struct {
	// JoinAttempts counts addresses the join and rejoin loop contacted;
	// JoinContacts those that answered and exchanged state.
	JoinAttempts, JoinContacts int64
	// Refused counts alive messages and state exchanges refused because
	// they came from, or carried, a peer with another key prefix or Redis
	// (or no quotad fingerprint).
	Refused int64
	Gossip  GossipStats
}

// Membership is this node's membership in a quotad cluster, on
// hashicorp/memberlist: who is alive (for lease caps and status pages),
// the gossip of denials and resets, and the rejoin loop that heals
// partitions. NewMembership starts it; Close leaves gracefully. All methods
// are safe for concurrent use.
type Membership struct {
	cfg  MembershipConfig
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
	members map[string]Member

	joinAttempts, joinContacts, refused atomic.Int64
	// refusedMu guards refusedAt: when each refused peer was last logged.
	refusedMu sync.Mutex
	refusedAt map[string]time.Time
	// gossipIDs are the members' gossip ids by name; guarded by mu.
	gossipIDs map[string]uint64

	// peers are the live members but this node, copied out of memberlist's
	// events for the gossip sender.
	peers atomic.Pointer[[]*memberlist.Node]

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

// NewMembership starts this node's gossip on cfg's address and a loop that
// joins the seeds in the background and keeps re-joining them and dead
// members. It returns once the gossip listener is up; joining is not
// awaited (see Size and Join). log may be nil (discard); memberlist's own
// log lines go to it too, at their levels.
func NewMembership(cfg MembershipConfig, log *slog.Logger) (*Membership, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Membership{
		cfg: cfg, log: log, members: make(map[string]Member), gossipIDs: make(map[string]uint64),
		refusedAt: make(map[string]time.Time), fp: newFingerprint(cfg.KeyPrefix, cfg.StoreID),
	}
	m.gossip = newGossip(log, newGossipID(), cfg.GossipMaxAge)
	mc, err := m.memberlistConfig()
	if err != nil {
		return nil, err
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
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

// memberlistConfig translates m.cfg into memberlist's configuration,
// starting from its LAN defaults.
func (m *Membership) memberlistConfig() (*memberlist.Config, error) {
	c := m.cfg
	mc := memberlist.DefaultLANConfig()
	if c.Transport != nil {
		mc.Transport = c.Transport
	} else {
		host, port, _ := splitAddr(c.BindAddr, false) // validated
		if host == "" {
			host = "0.0.0.0"
		}
		mc.BindAddr, mc.BindPort, mc.AdvertisePort = host, port, port
	}
	if c.AdvertiseAddr != "" {
		host, port, _ := splitAddr(c.AdvertiseAddr, false) // validated
		ip, err := m.resolveOne(host)
		if err != nil {
			return nil, fmt.Errorf("cluster advertise address: %w", err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = ip, port
	}
	mc.Name = c.NodeName
	if mc.Name == "" {
		hostname, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("cluster node name: none given and %w", err)
		}
		mc.Name = net.JoinHostPort(hostname, strconv.Itoa(mc.AdvertisePort))
	}
	m.name = mc.Name
	mc.SecretKey = c.SecretKey
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
	mc.Logger = log.New(&memberlistLog{log: m.log, closing: &m.closing}, "", 0)
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
func (m *Membership) Members() []Member {
	m.mu.Lock()
	out := make([]Member, 0, len(m.members))
	for _, mb := range m.members {
		out = append(out, mb)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Stats returns the rejoin loop's and the gossip's counters.
func (m *Membership) Stats() MembershipStats {
	return MembershipStats{
		JoinAttempts: m.joinAttempts.Load(),
		JoinContacts: m.joinContacts.Load(),
		Refused:      m.refused.Load(),
		Gossip:       m.gossip.stats(),
	}
}

// Join contacts the given addresses now ("host:port" or "host", DNS names
// expanded as for MembershipConfig.Join) and merges their view of the
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
		case mb.State == MemberAlive:
			skip[mb.Addr] = true
		case now.Sub(mb.Since) > m.cfg.ForgetDeadAfter:
			delete(m.members, name)
			delete(m.gossipIDs, name)
		case mb.State == MemberDead:
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
func leaveTimeout(c MembershipConfig) time.Duration {
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

// events records membership changes. memberlist calls it with its own
// locks held and never concurrently, so it only updates this node's table.
type events struct{ m *Membership }

func (e events) NotifyJoin(n *memberlist.Node)   { e.m.record(n, MemberAlive) }
func (e events) NotifyUpdate(n *memberlist.Node) { e.m.record(n, MemberAlive) }
func (e events) NotifyLeave(n *memberlist.Node) {
	state := MemberDead
	if metaLeaving(n.Meta) {
		state = MemberLeft
	}
	e.m.record(n, state)
}

func (m *Membership) record(n *memberlist.Node, state MemberState) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, known := m.members[n.Name]
	since := time.Now()
	if known && old.State == state {
		since = old.Since
	}
	self := n.Name == m.name
	m.members[n.Name] = Member{Name: n.Name, Addr: n.Address(), State: state, Self: self, Since: since}
	if meta, ok := decodeMeta(n.Meta); ok {
		m.gossipIDs[n.Name] = meta.gossipID
	}
	if !self {
		m.updatePeer(n, state == MemberAlive)
		m.updateSenders()
	}
	live := 0
	for _, mb := range m.members {
		if mb.State == MemberAlive {
			live++
		}
	}
	m.size.Store(int64(live))
	if !self && (!known || old.State != state) {
		m.log.Info("cluster: member "+state.String(), "member", n.Name, "addr", n.Address(), "members", live)
	}
}

// updateSenders tells the gossip the gossip ids of the live members but
// this node: the only senders it takes packets from. Called with m.mu
// held.
func (m *Membership) updateSenders() {
	senders := make(map[uint64]string)
	for name, mb := range m.members {
		if id, ok := m.gossipIDs[name]; ok && mb.State == MemberAlive && !mb.Self {
			senders[id] = name
		}
	}
	m.gossip.setSenders(senders, time.Now())
}

// newGossipID returns a random, non-zero gossip id for this process.
func newGossipID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// updatePeer adds n to the gossip sender's peers, or removes it. The
// copy is taken here, under memberlist's lock: the Node it passes is
// memberlist's own, which it rewrites later. Called with m.mu held.
func (m *Membership) updatePeer(n *memberlist.Node, alive bool) {
	var peers []*memberlist.Node
	if old := m.peers.Load(); old != nil {
		for _, p := range *old {
			if p.Name != n.Name {
				peers = append(peers, p)
			}
		}
	}
	if alive {
		peers = append(peers, &memberlist.Node{Name: n.Name, Addr: append(net.IP(nil), n.Addr...), Port: n.Port, PMin: n.PMin, PMax: n.PMax, PCur: n.PCur})
	}
	m.peers.Store(&peers)
}

// gossipLoop sends queued gossip to every live member, at once when
// something is queued and again one gossip interval later (each message
// goes out gossipTransmits times), until ctx ends.
//
// Unlike memberlist's own state, user messages are not relayed by their
// receivers, so memberlist's piggybacking (a few transmissions to random
// members) would leave some members without the message. Sending each
// batch to every member costs members × packets per round, which is
// small for the tens of nodes a quotad cluster runs; messages are batched
// into as few packets as they fit.
func (m *Membership) gossipLoop(ctx context.Context) {
	defer m.loops.Done()
	t := time.NewTicker(m.cfg.gossipInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.gossip.kick:
		}
		m.sendGossip()
	}
}

// sendGossip sends one round of queued gossip to every peer.
func (m *Membership) sendGossip() {
	if m.gossip.queue.NumQueued() == 0 {
		return
	}
	packets := m.gossip.nextPackets(time.Now())
	peers := m.peers.Load()
	if peers == nil {
		return
	}
	for _, pkt := range packets {
		for _, p := range *peers {
			if err := m.ml.SendBestEffort(p, pkt); err != nil {
				m.log.Debug("cluster: sending gossip", "to", p.Name, "err", err)
			}
		}
	}
}

// maxMemberlistWarnings is how many warning and error lines of
// memberlist's the log takes per second; the rest are counted and
// reported in the next line let through. memberlist writes one per bad
// packet ("decrypt packet failed", "handler queue full"), so a flood of
// junk would otherwise cost a log line per packet.
const maxMemberlistWarnings = 20

// memberlistLog turns memberlist's "[LEVEL] memberlist: text" lines into
// slog records at the same level, at most maxMemberlistWarnings warnings
// and errors a second; once closing is set, its failures to write to its
// own closed sockets are debug lines. memberlist writes from many
// goroutines.
type memberlistLog struct {
	log     *slog.Logger
	closing *atomic.Bool

	mu sync.Mutex
	// second is the Unix second being counted; sent the warnings and
	// errors let through in it, and suppressed those dropped since the
	// last one let through.
	second           int64
	sent, suppressed int
}

func (w *memberlistLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for _, l := range [...]struct {
		prefix string
		level  slog.Level
	}{{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo}, {"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelError}, {"[ERROR]", slog.LevelError}} {
		if rest, ok := strings.CutPrefix(line, l.prefix); ok {
			line, level = strings.TrimSpace(rest), l.level
			break
		}
	}
	if level > slog.LevelDebug && w.closing != nil && w.closing.Load() && strings.Contains(line, "use of closed network connection") {
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if !w.log.Enabled(ctx, level) {
		return len(p), nil
	}
	var attrs []any
	if level >= slog.LevelWarn {
		suppressed, ok := w.admit(time.Now().Unix())
		if !ok {
			return len(p), nil
		}
		if suppressed > 0 {
			attrs = append(attrs, "suppressed_before", suppressed)
		}
	}
	w.log.Log(ctx, level, strings.TrimPrefix(line, "memberlist: "), append(attrs, "component", "memberlist")...)
	return len(p), nil
}

// admit counts a warning in second and reports whether it goes to the log
// and, if so, how many were dropped since the last that did.
func (w *memberlistLog) admit(second int64) (suppressed int, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if second != w.second {
		w.second, w.sent = second, 0
	}
	if w.sent >= maxMemberlistWarnings {
		w.suppressed++
		return 0, false
	}
	w.sent++
	suppressed, w.suppressed = w.suppressed, 0
	return suppressed, true
}
