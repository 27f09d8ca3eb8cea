package main

import (
	"fmt"

	"github.com/quotad/quotad/algorithms"
)

// This file is what quotad checks of its settings for the memcached store
// (--memcache) before opening it.

// memcachePolicies refuses a configured policy the memcached store cannot
// keep: only fixed windows, as envoyproxy/ratelimit's memcache backend.
// (The node refuses them too; here the error names the setting to change
// before anything starts.)
func (c config) memcachePolicies() error {
	for i, p := range c.Policies {
		if a := p.Limit.Algorithm; a != algorithms.FixedWindow {
			return fmt.Errorf("policies[%d].algorithm: %s (policy %s): memcache keeps fixed windows only; make it fixed_window, or keep its state in Redis (--redis instead of --memcache)", i, a, p.Name)
		}
	}
	return nil
}
