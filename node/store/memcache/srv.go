package memcache

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file is the servers found by a DNS SRV record (Config.SRV), looked
// up once and, with Config.SRVRefresh, again and again.

// srvPattern is an SRV record's name, as envoyproxy/ratelimit parses it:
// _service._proto.name.
var srvPattern = regexp.MustCompile(`^_(.+?)\._(.+?)\.(.+)$`)

// splitSRV returns srv's service, protocol and name.
func splitSRV(srv string) (service, proto, name string, ok bool) {
	m := srvPattern.FindStringSubmatch(srv)
	if m == nil {
		return "", "", "", false
	}
	return m[1], m[2], m[3], true
}

// lookupServers returns the servers srv lists: target:port each (the
// target without its final dot), sorted, as envoyproxy/ratelimit sorts
// them.
func lookupServers(ctx context.Context, r *net.Resolver, srv string) ([]string, error) {
	service, proto, name, _ := splitSRV(srv)
	_, records, err := r.LookupSRV(ctx, service, proto, name)
	if err != nil {
		return nil, fmt.Errorf("memcache: look up SRV %s: %w", srv, err)
	}
	if len(records) == 0 {
		return nil, fmt.Errorf("memcache: SRV %s lists no server", srv)
	}
	addrs := make([]string, len(records))
	for i, r := range records {
		addrs[i] = net.JoinHostPort(strings.TrimSuffix(r.Target, "."), strconv.Itoa(int(r.Port)))
	}
	slices.Sort(addrs)
	return addrs, nil
}

// refreshServers looks the SRV record up every c.SRVRefresh until ctx
// ends, and replaces the client's servers when the list changed.
func refreshServers(ctx context.Context, c Config, cl *client) {
	t := time.NewTicker(c.SRVRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lctx, cancel := context.WithTimeout(ctx, srvLookupTimeout)
		addrs, err := lookupServers(lctx, c.Resolver, c.SRV)
		cancel()
		if err == nil {
			cl.setServers(addrs, c)
		}
	}
}

// srvLookupTimeout bounds one look-up of the SRV record.
const srvLookupTimeout = 5 * time.Second
