package main

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// This file reads the statistics part of envoyproxy/ratelimit's
// environment (envoy_ratelimit_env.go): statsd, DogStatsD and its
// mogrifiers.

// statsdVariables are the settings of upstream's statsd sinks.
var statsdVariables = []string{"STATSD_HOST", "STATSD_PORT", "STATSD_PROTOCOL", "STATS_FLUSH_INTERVAL", "EXTRA_TAGS", "USE_DOG_STATSD_MOGRIFIERS"}

// stats translates upstream's statistics sinks: statsd (USE_STATSD, true
// by default, to STATSD_HOST:STATSD_PORT over lyft/gostats's
// STATSD_PROTOCOL, tcp by default) or DogStatsD (USE_DOG_STATSD, over
// UDP), every STATS_FLUSH_INTERVAL, with EXTRA_TAGS; DISABLE_STATS sends
// none (--statsd-*). Upstream allows one sink of statsd, DogStatsD and
// Prometheus; quotad serves Prometheus beside either when both are asked
// for.
func (out *ratelimitEnv) stats(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	var on [4]bool
	for i, name := range []string{"DISABLE_STATS", "USE_STATSD", "USE_DOG_STATSD", "USE_PROMETHEUS"} {
		b, err := boolean(name)
		if err != nil {
			return err
		}
		on[i] = b
	}
	disabled, statsd, dog, prom := on[0], on[1], on[2], on[3]
	notNeeded := func(why string) {
		for _, name := range statsdVariables {
			if set(name) {
				out.notes = append(out.notes, name+" is not needed: "+why)
			}
		}
	}
	switch {
	case disabled && prom:
		return fmt.Errorf("DISABLE_STATS=true and USE_PROMETHEUS=true: upstream serves no statistics at all with DISABLE_STATS; unset one")
	case disabled:
		notNeeded("DISABLE_STATS=true sends no statistics")
		return nil
	case dog && statsd && set("USE_STATSD"):
		return fmt.Errorf("USE_DOG_STATSD=true and USE_STATSD=true: set one, as upstream (DogStatsD is statsd with tags)")
	case !dog && statsd && prom && !set("USE_STATSD"):
		out.notes = append(out.notes, "USE_STATSD defaults to true upstream, which refuses it beside USE_PROMETHEUS=true: quotad sends no statsd; set USE_STATSD=true to send it as well")
		statsd = false
	}
	if !statsd && !dog {
		notNeeded("used only with USE_STATSD=true or USE_DOG_STATSD=true")
		return nil
	}
	port, err := strconv.ParseUint(value("STATSD_PORT"), 10, 16)
	if err != nil || port == 0 {
		return fmt.Errorf("STATSD_PORT=%q: want a port number, 1 to 65535", value("STATSD_PORT"))
	}
	out.args = append(out.args, "--statsd-addr", net.JoinHostPort(value("STATSD_HOST"), strconv.FormatUint(port, 10)))
	protocol := strings.ToLower(value("STATSD_PROTOCOL"))
	switch {
	case dog:
		// Upstream's DogStatsD client sends datagrams whatever
		// STATSD_PROTOCOL says.
		protocol = statsdUDP
		if set("STATSD_PROTOCOL") {
			out.notes = append(out.notes, "STATSD_PROTOCOL is not needed: DogStatsD is sent over UDP, as upstream sends it")
		}
		out.args = append(out.args, "--statsd-dogstatsd")
	case protocol != statsdTCP && protocol != statsdUDP:
		return fmt.Errorf("STATSD_PROTOCOL=%q: want tcp or udp", value("STATSD_PROTOCOL"))
	}
	out.args = append(out.args, "--statsd-protocol", protocol)
	d, err := time.ParseDuration(value("STATS_FLUSH_INTERVAL"))
	if err != nil || d <= 0 {
		return fmt.Errorf("STATS_FLUSH_INTERVAL=%q: want a duration such as 10s", value("STATS_FLUSH_INTERVAL"))
	}
	out.args = append(out.args, "--statsd-flush-interval", d.String())
	if tags := value("EXTRA_TAGS"); tags != "" {
		if _, err := parseStatsdTags(tags); err != nil {
			return fmt.Errorf("EXTRA_TAGS=%q: want key:value,key:value", tags)
		}
		out.args = append(out.args, "--statsd-tags", tags)
	}
	if set("USE_DOG_STATSD_MOGRIFIERS") {
		if !dog {
			out.notes = append(out.notes, "USE_DOG_STATSD_MOGRIFIERS is not needed: used only with USE_DOG_STATSD=true")
			return nil
		}
		m, err := dogStatsdMogrifiers(value("USE_DOG_STATSD_MOGRIFIERS"), value)
		if err != nil {
			return err
		}
		out.args = append(out.args, "--statsd-mogrifiers", m)
	}
	return nil
}

// dogStatsdMogrifiers reads upstream's mogrifiers, named in list
// (USE_DOG_STATSD_MOGRIFIERS, "A,B"), each from its
// DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS
// ("key:template,key:template"), as its src/godogstats reads them, into
// --statsd-mogrifiers' JSON.
func dogStatsdMogrifiers(list string, value func(string) string) (string, error) {
	var specs []statsdMogrifierSpec
	for _, key := range strings.Split(list, ",") {
		key = strings.TrimSpace(key)
		if key == "" {
			continue
		}
		prefix := "DOG_STATSD_MOGRIFIER_" + strings.ToUpper(key) + "_"
		sp := statsdMogrifierSpec{Pattern: value(prefix + "PATTERN"), Name: value(prefix + "NAME")}
		if sp.Pattern == "" || sp.Name == "" {
			return "", fmt.Errorf("USE_DOG_STATSD_MOGRIFIERS names %s: set %sPATTERN and %sNAME", key, prefix, prefix)
		}
		if tags := value(prefix + "TAGS"); tags != "" {
			sp.Tags = map[string]string{}
			for _, kv := range strings.Split(tags, ",") {
				k, v, ok := strings.Cut(kv, ":")
				if !ok || k == "" || v == "" {
					return "", fmt.Errorf("%sTAGS=%q: want key:template,key:template", prefix, tags)
				}
				sp.Tags[k] = v
			}
		}
		specs = append(specs, sp)
	}
	text, err := json.Marshal(specs)
	if err != nil {
		return "", err
	}
	if _, err := parseStatsdMogrifiers(string(text)); err != nil {
		return "", fmt.Errorf("USE_DOG_STATSD_MOGRIFIERS=%s: %w", list, err)
	}
	return string(text), nil
}
