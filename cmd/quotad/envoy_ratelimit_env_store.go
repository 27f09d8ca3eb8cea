package main

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/node/store/memcache"
)

// This file reads the store part of envoyproxy/ratelimit's environment
// (envoy_ratelimit_env.go): Redis and memcached, with their TLS.

// redis translates REDIS_*: one server over TCP or a Unix socket, Sentinel
// (REDIS_URL "master,host:port,...") or Cluster (REDIS_URL
// "host:port,..."), with REDIS_AUTH ("password" or "user:password") and
// REDIS_TLS with its CA, client certificate and host name check.
func (out *ratelimitEnv) redis(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	tls, err := boolean("REDIS_TLS")
	if err != nil {
		return err
	}
	if set("REDIS_TLS_CACERT") {
		if !tls {
			return fmt.Errorf("REDIS_TLS_CACERT needs REDIS_TLS=true")
		}
		out.args = append(out.args, "--redis-tls-ca", value("REDIS_TLS_CACERT"))
	}
	// Upstream presents a client certificate when both files are set;
	// quotad refuses one without the other rather than leave it unused.
	if set("REDIS_TLS_CLIENT_CERT") || set("REDIS_TLS_CLIENT_KEY") {
		switch {
		case !tls:
			return fmt.Errorf("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY need REDIS_TLS=true")
		case !set("REDIS_TLS_CLIENT_CERT") || !set("REDIS_TLS_CLIENT_KEY"):
			return fmt.Errorf("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together: set both, or neither")
		}
		out.args = append(out.args, "--redis-tls-cert-file", value("REDIS_TLS_CLIENT_CERT"), "--redis-tls-key-file", value("REDIS_TLS_CLIENT_KEY"))
	}
	// As upstream, the chain is still verified, against REDIS_TLS_CACERT
	// (or the system's roots), only the host name is not.
	if skip, err := boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"); err != nil {
		return err
	} else if skip {
		if !tls {
			return fmt.Errorf("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true needs REDIS_TLS=true")
		}
		out.args = append(out.args, "--redis-tls-skip-hostname-verification")
	}
	if set("REDIS_TIMEOUT") {
		d, err := time.ParseDuration(value("REDIS_TIMEOUT"))
		if err != nil || d <= 0 {
			return fmt.Errorf("REDIS_TIMEOUT=%q: want a duration such as 10s", value("REDIS_TIMEOUT"))
		}
		out.args = append(out.args, "--redis-connect-timeout", d.String())
		out.notes = append(out.notes, "REDIS_TIMEOUT bounds opening a Redis connection (--redis-connect-timeout); a check waits at most --redis-timeout (50ms) for its reply, and a failing Redis opens the circuit breaker")
	}
	user, password := "", value("REDIS_AUTH")
	if u, p, ok := strings.Cut(password, ":"); ok {
		user, password = u, p
	}
	addrs := strings.Split(value("REDIS_URL"), ",")
	for i := range addrs {
		addrs[i] = strings.TrimSpace(addrs[i])
	}
	socket := strings.ToLower(value("REDIS_SOCKET_TYPE"))
	if socket != "tcp" && socket != "unix" {
		return fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", value("REDIS_SOCKET_TYPE"))
	}
	t := strings.ToLower(value("REDIS_TYPE"))
	if set("REDIS_SENTINEL_AUTH") && t != "sentinel" {
		out.notes = append(out.notes, "REDIS_SENTINEL_AUTH is not needed: used only with REDIS_TYPE=sentinel")
	}
	switch t {
	case "single":
		u := &url.URL{Scheme: "redis", Host: addrs[0], Path: "/0"}
		if tls {
			u.Scheme = "rediss"
		}
		if socket == "unix" {
			if tls {
				return fmt.Errorf("REDIS_TLS=true over REDIS_SOCKET_TYPE=unix: TLS needs tcp")
			}
			u = &url.URL{Scheme: "unix", Path: addrs[0]}
		}
		if len(addrs) != 1 || addrs[0] == "" {
			return fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=single wants one address", value("REDIS_URL"))
		}
		if password != "" {
			u.User = url.UserPassword(user, password)
		}
		out.args = append(out.args, "--redis", u.String())
		return nil
	case "sentinel", "cluster":
		if socket != "tcp" {
			return fmt.Errorf("REDIS_TYPE=%s needs REDIS_SOCKET_TYPE=tcp", t)
		}
		if user != "" {
			out.args = append(out.args, "--redis-username", user)
		}
		if password != "" {
			out.env["QUOTAD_REDIS_PASSWORD"] = password
		}
		if tls {
			out.args = append(out.args, "--redis-tls")
		}
		if t == "cluster" {
			out.args = append(out.args, "--redis-cluster", strings.Join(addrs, ","))
			return nil
		}
		if len(addrs) < 2 {
			return fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=sentinel wants the master's name, then the sentinels (mymaster,host:port,host:port)", value("REDIS_URL"))
		}
		out.args = append(out.args, "--redis-master", addrs[0], "--redis-sentinel", strings.Join(addrs[1:], ","))
		if a := value("REDIS_SENTINEL_AUTH"); a != "" {
			su, sp := "", a
			if u, p, ok := strings.Cut(a, ":"); ok {
				su, sp = u, p
			}
			if su != "" {
				out.args = append(out.args, "--redis-sentinel-username", su)
			}
			out.env["QUOTAD_REDIS_SENTINEL_PASSWORD"] = sp
		}
		return nil
	default:
		return fmt.Errorf("REDIS_TYPE=%q: want single, sentinel or cluster", value("REDIS_TYPE"))
	}
}

// memcache translates BACKEND_TYPE=memcache: MEMCACHE_HOST_PORT's
// servers (host:port,host:port, in the order that spreads the keys, as
// upstream's gomemcache spreads them) into --memcache, or MEMCACHE_SRV
// (memcacheServers),
// MEMCACHE_MAX_IDLE_CONNS (upstream's 2 by default; 0 or less is
// gomemcache's default, 2) into --memcache-max-idle-conns, and
// MEMCACHE_TLS with its CA, client certificate and host name check into
// --memcache-tls and its files.
func (out *ratelimitEnv) memcache(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	if err := out.memcacheTLS(value, set, boolean); err != nil {
		return err
	}
	if err := out.memcacheServers(value, set); err != nil {
		return err
	}
	n, err := strconv.Atoi(value("MEMCACHE_MAX_IDLE_CONNS"))
	if err != nil {
		return fmt.Errorf("MEMCACHE_MAX_IDLE_CONNS=%q: want a number of connections, e.g. 2", value("MEMCACHE_MAX_IDLE_CONNS"))
	}
	if n <= 0 {
		out.notes = append(out.notes, fmt.Sprintf("MEMCACHE_MAX_IDLE_CONNS=%d: quotad keeps %d idle connections per server, as upstream's memcached client does for 0 or less", n, memcache.DefaultMaxIdleConns))
		n = memcache.DefaultMaxIdleConns
	}
	out.args = append(out.args, "--memcache-max-idle-conns", strconv.Itoa(n))
	return nil
}

// memcacheServers translates MEMCACHE_HOST_PORT into --memcache, or
// MEMCACHE_SRV and MEMCACHE_SRV_REFRESH (0, upstream's default, looks it
// up once) into --memcache-srv and --memcache-srv-refresh. As upstream,
// one of the first two, not both.
func (out *ratelimitEnv) memcacheServers(value func(string) string, set func(string) bool) error {
	hosts, srv := value("MEMCACHE_HOST_PORT"), value("MEMCACHE_SRV")
	switch {
	case hosts != "" && srv != "":
		return fmt.Errorf("MEMCACHE_HOST_PORT and MEMCACHE_SRV are both set: set one, as upstream")
	case srv != "":
		if err := (memcache.Config{SRV: srv}).Validate(); err != nil {
			return fmt.Errorf("MEMCACHE_SRV=%q: %w", srv, err)
		}
		out.args = append(out.args, "--memcache-srv", srv)
		if set("MEMCACHE_SRV_REFRESH") {
			d, err := time.ParseDuration(value("MEMCACHE_SRV_REFRESH"))
			if err != nil || d < 0 {
				return fmt.Errorf("MEMCACHE_SRV_REFRESH=%q: want a duration such as 30s (0 looks the record up once)", value("MEMCACHE_SRV_REFRESH"))
			}
			if d > 0 {
				out.args = append(out.args, "--memcache-srv-refresh", d.String())
			}
		}
		return nil
	case hosts == "":
		return fmt.Errorf("BACKEND_TYPE=memcache needs MEMCACHE_HOST_PORT (memcached's servers, host:port,host:port) or MEMCACHE_SRV (an SRV record that lists them)")
	}
	if set("MEMCACHE_SRV_REFRESH") {
		out.notes = append(out.notes, "MEMCACHE_SRV_REFRESH is not needed: used only with MEMCACHE_SRV")
	}
	addrs := strings.Split(hosts, ",")
	for i := range addrs {
		addrs[i] = strings.TrimSpace(addrs[i])
	}
	if err := (memcache.Config{Addrs: addrs}).Validate(); err != nil {
		return fmt.Errorf("MEMCACHE_HOST_PORT=%q: %w", hosts, err)
	}
	out.args = append(out.args, "--memcache", strings.Join(addrs, ","))
	return nil
}

// memcacheTLS translates MEMCACHE_TLS and its files. Upstream reads the
// files only with MEMCACHE_TLS=true; quotad refuses them without it, as it
// refuses REDIS_TLS's, rather than leave them unused.
func (out *ratelimitEnv) memcacheTLS(value func(string) string, set func(string) bool, boolean func(string) (bool, error)) error {
	tls, err := boolean("MEMCACHE_TLS")
	if err != nil {
		return err
	}
	skip, err := boolean("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION")
	if err != nil {
		return err
	}
	files := set("MEMCACHE_TLS_CACERT") || set("MEMCACHE_TLS_CLIENT_CERT") || set("MEMCACHE_TLS_CLIENT_KEY") || skip
	if !tls {
		if files {
			return fmt.Errorf("MEMCACHE_TLS_CACERT, MEMCACHE_TLS_CLIENT_CERT, MEMCACHE_TLS_CLIENT_KEY and MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION need MEMCACHE_TLS=true")
		}
		return nil
	}
	out.args = append(out.args, "--memcache-tls")
	if set("MEMCACHE_TLS_CACERT") {
		out.args = append(out.args, "--memcache-tls-ca", value("MEMCACHE_TLS_CACERT"))
	}
	if set("MEMCACHE_TLS_CLIENT_CERT") || set("MEMCACHE_TLS_CLIENT_KEY") {
		if !set("MEMCACHE_TLS_CLIENT_CERT") || !set("MEMCACHE_TLS_CLIENT_KEY") {
			return fmt.Errorf("MEMCACHE_TLS_CLIENT_CERT and MEMCACHE_TLS_CLIENT_KEY go together: set both, or neither")
		}
		out.args = append(out.args, "--memcache-tls-cert-file", value("MEMCACHE_TLS_CLIENT_CERT"), "--memcache-tls-key-file", value("MEMCACHE_TLS_CLIENT_KEY"))
	}
	if skip {
		out.args = append(out.args, "--memcache-tls-skip-hostname-verification")
	}
	return nil
}
