package main

import (
	"fmt"
	"strings"
	"testing"
)

// The lines of one flush go in as few datagrams as fit an Ethernet frame
// (1432 bytes), in order and whole, each line ended by a newline; a line
// longer than that goes alone rather than being cut.
func TestStatsdDatagramsFitAnEthernetFrame(t *testing.T) {
	var lines []string
	for i := range 200 {
		lines = append(lines, fmt.Sprintf("ratelimit.service.rate_limit.domain_%d.key_value.total_hits:%d|c", i, i))
	}
	long := strings.Repeat("x", 2000) + ":1|c"
	lines = append(lines[:100:100], append([]string{long}, lines[100:]...)...)
	grams := statsdDatagrams(lines, statsdMaxDatagram)
	var all strings.Builder
	for i, g := range grams {
		if len(g) > statsdMaxDatagram && string(g) != long+"\n" {
			t.Errorf("datagram %d: %d bytes, more than %d and not the long line alone", i, len(g), statsdMaxDatagram)
		}
		if g[len(g)-1] != '\n' {
			t.Errorf("datagram %d does not end a line", i)
		}
		all.Write(g)
	}
	if want := strings.Join(lines, "\n") + "\n"; all.String() != want {
		t.Errorf("the datagrams do not carry the lines in order")
	}
	// Packed: the next datagram's first line would not have fitted.
	for i := 0; i+1 < len(grams); i++ {
		if next := strings.IndexByte(string(grams[i+1]), '\n') + 1; len(grams[i])+next <= statsdMaxDatagram {
			t.Errorf("datagram %d (%d bytes) had room for the next line (%d bytes)", i, len(grams[i]), next)
		}
	}
}

// --statsd-* settings that would send nothing or cannot be sent are
// refused with the flag to set.
func TestStatsdSettingsRefused(t *testing.T) {
	for _, c := range []struct {
		cfg  statsdConfig
		want string
	}{
		{statsdConfig{Tags: "env:prod"}, "statsd tags: --statsd-tags needs --statsd-addr (where to send the statistics)"},
		{statsdConfig{DogStatsD: true}, "statsd dogstatsd: --statsd-dogstatsd needs --statsd-addr (where to send the statistics)"},
		{statsdConfig{Addr: "statsd", Protocol: statsdUDP, FlushInterval: 1}, `statsd addr: "statsd": want host:port, e.g. localhost:8125`},
		{statsdConfig{Addr: "statsd:8125", Protocol: "quic", FlushInterval: 1}, `statsd protocol: "quic": want udp or tcp`},
		{statsdConfig{Addr: "statsd:8125", Protocol: statsdTCP}, "statsd flush interval: 0s must be > 0"},
		{statsdConfig{Addr: "statsd:8125", Protocol: statsdTCP, FlushInterval: 1, Tags: "prod"}, `statsd tags: "prod": want key:value,key:value`},
		{statsdConfig{Mogrifiers: `[]`}, "statsd mogrifiers: --statsd-mogrifiers needs --statsd-addr (where to send the statistics)"},
		{statsdConfig{Addr: "statsd:8125", Protocol: statsdUDP, FlushInterval: 1, Mogrifiers: `[{"pattern": "a", "name": "b"}]`},
			"statsd mogrifiers: --statsd-mogrifiers rewrites DogStatsD names; it needs --statsd-dogstatsd"},
		{statsdConfig{Addr: "statsd:8125", Protocol: statsdUDP, FlushInterval: 1, DogStatsD: true, Mogrifiers: `[{"pattern": "a"}]`},
			"statsd mogrifiers: mogrifier 1: a pattern and a name are both needed"},
		{statsdConfig{Addr: "statsd:8125", Protocol: statsdUDP, FlushInterval: 1, DogStatsD: true, Mogrifiers: `[{"pattern": "a", "name": "b", "tag": {}}]`},
			`statsd mogrifiers: want a JSON array of {"pattern": "regexp", "name": "template", "tags": {"key": "template"}}: json: unknown field "tag"`},
	} {
		if err := c.cfg.validate(); err == nil || err.Error() != c.want {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}

// A mogrifier rewrites the names it matches, the first that matches
// winning, with its pattern's groups in the name and the tags (tags sorted
// by key); "$9" of a pattern with fewer groups stays as written, as
// upstream's; a name none matches is left alone.
func TestMogrify(t *testing.T) {
	ms, err := parseStatsdMogrifiers(`[
		{"pattern": "^ratelimit\\.service\\.rate_limit\\.([^.]+)\\.(.*)\\.([^.]+)$", "name": "ratelimit.service.rate_limit.$3", "tags": {"domain": "$1", "descriptor": "$2$9"}},
		{"pattern": "^ratelimit\\.(.*)$", "name": "other.$1"}]`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		in, name string
		tags     []string
	}{
		{"ratelimit.service.rate_limit.rl.category_account.total_hits", "ratelimit.service.rate_limit.total_hits", []string{"descriptor:category_account$9", "domain:rl"}},
		{"ratelimit.service.global_shadow_mode", "other.service.global_shadow_mode", nil},
		{"quotad.other", "quotad.other", nil},
	} {
		name, tags := mogrify(ms, c.in)
		if name != c.name || strings.Join(tags, ",") != strings.Join(c.tags, ",") {
			t.Errorf("%s: %s %v, want %s %v", c.in, name, tags, c.name, c.tags)
		}
	}
}
