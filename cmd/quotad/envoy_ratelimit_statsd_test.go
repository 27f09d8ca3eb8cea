package main

import (
	"bufio"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotad/quotad/internal/redistest"
)

// statsdServer is a statsd server of a test's own on loopback: it keeps
// every line it receives, over UDP or TCP, and the largest datagram.
type statsdServer struct {
	mu          sync.Mutex
	lines       []string
	maxDatagram int
}

// startStatsd listens on a free loopback port over protocol (udp or tcp)
// until the test ends, and returns the server and its port.
func startStatsd(t *testing.T, protocol string) (*statsdServer, string) {
	t.Helper()
	s := &statsdServer{}
	if protocol == "udp" {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				s.mu.Lock()
				s.maxDatagram = max(s.maxDatagram, n)
				s.mu.Unlock()
				s.add(string(buf[:n]))
			}
		}()
		return s, strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			conns = append(conns, c)
			s.mu.Unlock()
			go func() {
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					s.add(sc.Text())
				}
			}()
		}
	}()
	return s, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func (s *statsdServer) add(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, strings.Split(strings.TrimSuffix(text, "\n"), "\n")...)
}

// counts sums the counter lines received by their name and tags: the line
// without its count ("name|c|#tags" for "name:3|c|#tags").
func (s *statsdServer) counts(t *testing.T) map[string]int64 {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	for _, l := range s.lines {
		name, rest, ok := strings.Cut(l, ":")
		count, suffix, ok2 := strings.Cut(rest, "|")
		n, err := strconv.ParseInt(count, 10, 64)
		if !ok || !ok2 || err != nil || !strings.HasPrefix(suffix, "c") {
			t.Errorf("statsd line %q is not a counter's name:count|c", l)
			continue
		}
		out[name+"|"+suffix] += n
	}
	return out
}

// dump is what was received, sorted, for a failure's message.
func (s *statsdServer) dump() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := append([]string(nil), s.lines...)
	sort.Strings(l)
	return strings.Join(l, "\n")
}

// The built `quotad envoy-ratelimit` sends envoyproxy/ratelimit's
// statistics to statsd: three requests for a rule of two a minute are
// counted under that project's names (total_hits 3, within_limit 2,
// near_limit 1 at its 0.8 ratio, over_limit 1), once each (the counts
// stay put at later flushes), over TCP by default as upstream's gostats
// sink sends, over UDP in datagrams of at most 1432 bytes, with
// EXTRA_TAGS in the name as gostats writes tags, with USE_DOG_STATSD as
// DogStatsD tags, and renamed by upstream README's example mogrifier.
func TestEnvoyRatelimitSendsStatsd(t *testing.T) {
	named := func(prefix, suffix string) func(string) string {
		return func(stat string) string { return prefix + stat + suffix }
	}
	const rule = "ratelimit.service.rate_limit.rl.category_account."
	for _, c := range []struct {
		name, protocol string
		env            []string
		// key is a statistic's line as counts keeps it: without its count.
		key func(stat string) string
	}{
		{name: "statsd over tcp, upstream's default", protocol: "tcp", env: nil, key: named(rule, "|c")},
		{name: "statsd over udp with tags", protocol: "udp", env: []string{"STATSD_PROTOCOL=udp", "EXTRA_TAGS=release:v1.2,env:test"},
			key: named(rule, ".__env=test.__release=v1_2|c")},
		{name: "dogstatsd", protocol: "udp", env: []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "EXTRA_TAGS=release:v1.2,env:test"},
			key: named(rule, "|c|#env:test,release:v1.2")},
		// upstream README's example mogrifier.
		{name: "dogstatsd with a mogrifier", protocol: "udp", env: []string{"USE_STATSD=false", "USE_DOG_STATSD=true", "EXTRA_TAGS=env:test",
			"USE_DOG_STATSD_MOGRIFIERS=HITS", `DOG_STATSD_MOGRIFIER_HITS_PATTERN=^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`,
			"DOG_STATSD_MOGRIFIER_HITS_NAME=ratelimit.service.rate_limit.$3", "DOG_STATSD_MOGRIFIER_HITS_TAGS=domain:$1,descriptor:$2"},
			key: named("ratelimit.service.rate_limit.", "|c|#env:test,descriptor:category_account,domain:rl")},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := redistest.Start(t)
			statsd, port := startStatsd(t, c.protocol)
			env := append([]string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.Addr(), "STATSD_HOST=127.0.0.1", "STATSD_PORT=" + port,
				"STATS_FLUSH_INTERVAL=100ms"}, c.env...)
			p := startRatelimit(t, ratelimitRule("2"), env...)
			for i, want := range []int{200, 200, http.StatusTooManyRequests} {
				if got := p.askJSON(t); got != want {
					t.Fatalf("/json %d: %d, want %d", i+1, got, want)
				}
			}
			want := map[string]int64{}
			for stat, n := range map[string]int64{"total_hits": 3, "within_limit": 2, "near_limit": 1, "over_limit": 1} {
				want[c.key(stat)] = n
			}
			equal := func() bool {
				got := statsd.counts(t)
				for k, n := range want {
					if got[k] != n {
						return false
					}
				}
				return len(got) == len(want)
			}
			for deadline := time.Now().Add(30 * time.Second); !equal(); time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("statsd got, in 30s:\n%s\nwant the counts %v\n%s", statsd.dump(), want, p.stderr.tail())
				}
			}
			// Later flushes send nothing more: no request came since.
			time.Sleep(500 * time.Millisecond)
			if !equal() {
				t.Errorf("statsd got more after the counts were sent:\n%s\nwant %v", statsd.dump(), want)
			}
			statsd.mu.Lock()
			defer statsd.mu.Unlock()
			if statsd.maxDatagram > 1432 {
				t.Errorf("a datagram of %d bytes, want at most 1432", statsd.maxDatagram)
			}
		})
	}
}
