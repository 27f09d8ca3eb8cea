package main

import (
	"fmt"
	"regexp"
	"strings"
)

// This file places the config's errors: a problem found in the file, or
// once file, environment and flags are merged, is reported at the file's
// line and field when the file is where the value came from.

// fieldError is err, a problem with the settings under field (a section,
// a policy, or "" for the whole file), as a fileError at the line of the
// field err names. Validation errors of quotad's packages start with the
// field they are about ("limit: ...", "envoy.domains[0].domain: ..."),
// relative to field or from the top; that prefix becomes the fileError's
// Field.
func (d *yamlDoc) fieldError(field string, err error) *fileError {
	msg := err.Error()
	name, rest, ok := strings.Cut(msg, ": ")
	if ok && fieldPath.MatchString(name) {
		if field != "" && !strings.HasPrefix(name, field) {
			if name == "policy" && strings.HasPrefix(field, "policies[") {
				name = "name" // node names a policy's name "policy"
			}
			name = field + "." + name
		}
		line, _ := d.lineOf(name)
		return d.errorAt(line, name, trimmedError{rest, err})
	}
	if field == "" {
		// A message that names its setting in words (mergedFields).
		for _, m := range mergedFields {
			if rest, ok := strings.CutPrefix(msg, m.prefix+": "); ok {
				if line, at := d.lineOf(m.field); at == m.field {
					return d.errorAt(line, m.field, trimmedError{rest, err})
				}
				break
			}
		}
	}
	line, _ := d.lineOf(field)
	return d.errorAt(line, field, err)
}

// fieldPath matches a field as the file spells it: lease.hold,
// envoy.domains[0].descriptors[1].policy.
var fieldPath = regexp.MustCompile(`^[a-z_]+(\[\d+\])*(\.[a-z_]+(\[\d+\])*)*$`)

// trimmedError is err with its text shortened to msg (the field it named
// moved to the fileError); errors.Is still sees err.
type trimmedError struct {
	msg string
	err error
}

func (e trimmedError) Error() string { return e.msg }
func (e trimmedError) Unwrap() error { return e.err }

// mergedFields maps how an error of the merged settings (validate) starts
// to the field of the config file it is about; the first match wins, so
// longer prefixes come first. The messages are those of validate and of
// the packages' Validate methods it calls.
var mergedFields = []struct{ prefix, field string }{
	{"listen", "listen"},
	{"redis timeout", "redis.timeout"},
	{"redis url", "redis.url"},
	{"redis cluster address", "redis.cluster"},
	{"redis sentinel address", "redis.sentinel"},
	{"redis master name", "redis.master"},
	{"redis sentinel credentials", "redis"},
	{"redis db", "redis.db"},
	{"redis tls ca file", "redis.tls_ca_file"},
	{"redis tls cert file", "redis.tls_cert_file"},
	{"redis tls key file", "redis.tls_key_file"},
	{"redis tls skip hostname verification", "redis.tls_skip_hostname_verification"},
	{"redis", "redis"},
	{"breaker failures", "breaker.failures"},
	{"breaker probe", "breaker.probe_every"},
	{"key_prefix", "key_prefix"},
	{"default failure mode", "default_on_store_error"},
	{"shutdown timeout", "shutdown_timeout"},
	{"log level", "log_level"},
	{"lease horizon", "lease.horizon"},
	{"lease hold", "lease.hold"},
	{"lease max fraction", "lease.max_fraction"},
	{"denied cache: max entries and max bytes", "denied_cache"},
	{"denied cache: max entries", "denied_cache.max_entries"},
	{"denied cache: max bytes", "denied_cache.max_bytes"},
	{"max connection age grace", "max_connection_age_grace"},
	{"max connection age", "max_connection_age"},
	{"max batch", "max_batch"},
	{"max request bytes", "max_request_bytes"},
	{"trace exporter", "tracing.exporter"},
	{"trace endpoint", "tracing.endpoint"},
	{"trace sample ratio", "tracing.sample_ratio"},
	{"statsd addr", "statsd.addr"},
	{"statsd protocol", "statsd.protocol"},
	{"statsd flush interval", "statsd.flush_interval"},
	{"statsd tags", "statsd.tags"},
	{"statsd dogstatsd", "statsd.dogstatsd"},
	{"statsd mogrifiers", "statsd.mogrifiers"},
	{"cluster bind address", "cluster.addr"},
	{"cluster advertise address", "cluster.advertise"},
	{"cluster node name", "cluster.node_name"},
	{"cluster key", "cluster.key_file"},
	{"cluster dead after", "cluster.dead_after"},
	{"cluster rejoin interval", "cluster.rejoin_interval"},
	{"join[", "cluster.join"},
	{"cluster", "cluster"},
	{"envoy near limit ratio", "envoy.near_limit_ratio"},
}

// mergedError is err, a problem validate found once file, environment and
// flags were merged. When it concerns a section of the config file doc and
// no flag or environment variable of that section was applied (overrides
// holds the sections, as the file's top-level keys, that one was applied
// to), it is a fileError at the field's line; otherwise it reads
// "config: ...", naming the setting.
func mergedError(err error, doc *yamlDoc, overrides map[string]bool) error {
	if doc != nil {
		msg := err.Error()
		// A policy's field, as the file spells it: policies come from the
		// file alone.
		if name, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(name, "policies[") && fieldPath.MatchString(name) {
			if line, _ := doc.lineOf(name); line > 0 {
				return doc.errorAt(line, name, trimmedError{rest, err})
			}
		}
		for _, m := range mergedFields {
			if !strings.HasPrefix(msg, m.prefix) {
				continue
			}
			line, field := doc.lineOf(m.field)
			section, _, _ := strings.Cut(m.field, ".")
			if line == 0 || overrides[section] {
				break
			}
			if rest, ok := strings.CutPrefix(msg, m.prefix+": "); ok && field == m.field {
				// The field replaces the message's own name for it.
				return doc.errorAt(line, field, trimmedError{rest, err})
			}
			return doc.errorAt(line, field, err)
		}
	}
	return fmt.Errorf("config: %w", err)
}
