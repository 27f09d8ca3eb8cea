// Package rpc is quotad's wire: the service core of quotad.v1.QuotaService
// and its two front ends on one port — connect-go's handlers (Connect,
// gRPC, gRPC-Web and HTTP/JSON on one http.Handler) and grpc-go's
// registrations, which serve gRPC connections on a cheaper transport
// (NewServer) — with Envoy's rate limit service (package rpc/envoy)
// mounted on both; request validation, the conversion between protobuf
// messages and node's domain types, the choice of error code (for Envoy's
// errors too), call telemetry, gRPC reflection and health, and the plain
// HTTP pages.
package rpc

import (
	"errors"
	"fmt"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/rpc/envoy"
	"github.com/quotad/quotad/rpc/rlqs"
)

// Bounds and defaults of Config.
const (
	// MaxBatchLimit is the largest CheckBatch the API allows (see
	// CheckBatchRequest in quota.proto); it is also the default.
	MaxBatchLimit = 1000
	// DefaultMaxRequestBytes is the default bound on one batch's request
	// message: a CheckBatch of MaxBatchLimit checks at every field's
	// maximum (1 KiB keys, 128-byte policies, inline limits) is 1.20 MB
	// in protobuf and 1.34 MB in JSON. Each bomb or oversized body costs a
	// node up to about four times the bound in buffers (the message read,
	// then inflated, each into a buffer grown by doubling), so the bound
	// is kept near what a batch needs.
	DefaultMaxRequestBytes = 2 << 20
)

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("invalid config")

// Config is the wire's configuration. The zero value is the default
// configuration: inline limits allowed with periods of up to a day,
// batches of up to 1000 checks in messages of up to 2 MiB. Build it
// with defaults, apply overrides, then Validate (NewHandler does).
type Config struct {
	// DisableInlineLimits rejects checks that carry their own limit with
	// PermissionDenied, so that only configured policies can be used.
	// Default false: inline limits are allowed. (The field is negative so
	// that the zero Config has the documented default.)
	DisableInlineLimits bool
	// DisableClientLeases answers AcquireLease as Check, granting no units,
	// so that clients check every request with the server. Default false:
	// client leases are granted (node.GrantLease).
	DisableClientLeases bool
	// MaxBatch is the most checks one CheckBatch may carry, 1 to
	// MaxBatchLimit. 0 means MaxBatchLimit (1000).
	MaxBatch int
	// MaxRequestBytes bounds the size of one request message of the calls
	// that carry many checks, CheckBatch and Envoy's ShouldRateLimit, in
	// bytes, after decompression; a larger message fails with
	// ResourceExhausted. Every other call's message is bounded by the
	// smaller of MaxRequestBytes and MaxCallRequestBytes (64 KiB). 0 means
	// DefaultMaxRequestBytes (2 MiB, room for a full batch of 1000 checks
	// with 1 KiB keys, in JSON too). It also bounds what a compressed
	// message may inflate to: inflating stops there.
	MaxRequestBytes int
	// MaxInlinePeriod bounds how long an inline limit's state may live in
	// the store: its period, and for the buckets and GCRA the time to
	// restore a full burst (capacity × period / limit). Longer inline
	// limits fail with InvalidArgument; configured policies are not
	// bounded. 0 means DefaultMaxInlinePeriod (24h); algorithms.MaxPeriod
	// (365 days) allows every period.
	MaxInlinePeriod time.Duration
	// Health is the server's readiness, which the caller keeps to Drain it
	// on shutdown. nil means NewHandler makes its own.
	Health *Health
	// Envoy, when set, serves Envoy's rate limit service, deciding with the
	// rules it holds, whatever they are: the caller compiled them
	// (envoy.Compile, against the node's policies) and may Swap in new ones
	// at any time, e.g. on hot reload (Handler.SetRules does). Its requests
	// carry up to MaxBatch descriptors. nil, the default, leaves the service
	// unserved, and then no later rules can serve it.
	Envoy *envoy.Switch
	// RLQS, when set, serves Envoy's rate limit quota service
	// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService) on the
	// gRPC front end, the one Envoy streams to; the caller runs its rounds
	// (rlqs.Service.Run). nil, the default, leaves it unserved.
	RLQS *rlqs.Service
	// Telemetry is where the wire sends traces and metrics; the zero value
	// sends none.
	Telemetry Telemetry
	// DisableConsole leaves the web console (GET / and /console/, package
	// rpc/console) unserved. Default false: served. GET /status, the
	// figures it shows, is served either way.
	DisableConsole bool
	// ShowKeys makes GET /status, and so the console, show the keys denied
	// most as they are. Default false: each is shown as a hash (hashKey),
	// since keys are often a user, an IP address or an API key, and the
	// page answers any client that can reach it.
	ShowKeys bool
	// ConfigGeneration reports the configuration the node runs, for GET
	// /status: its generation (1 for the one loaded at start, one more per
	// reload) and when it was loaded. nil means nothing reloads it: the
	// page shows generation null and the time NewHandler ran. It is called
	// on every GET /status and must be safe for concurrent use.
	ConfigGeneration func() (generation uint64, loadedAt time.Time)
	// AdminToken, when not empty, is the bearer token that admin calls
	// (Reset, and any later call that changes state for every client)
	// require: a call without "Authorization: Bearer <token>" fails with
	// Unauthenticated, one with another token with PermissionDenied.
	// Printable ASCII without spaces. Empty, the default, leaves admin calls
	// open to every client whose Host the Host check allows (Listen,
	// AllowedHosts).
	AdminToken string
	// Listen is the API's listen address as configured (host:port, the
	// port does not matter, or unix:PATH for a Unix socket). With
	// AllowedHosts it says which Host headers the console, GET /status,
	// GET /cluster and, without AdminToken, the admin calls answer
	// (host_check.go): always localhost and names under .localhost; for an
	// empty or unspecified host (":8080") every IP address, for a loopback
	// one or a Unix socket the loopback addresses, else that address or
	// name. Other Hosts get 403 (PermissionDenied for calls).
	// Empty, the zero value, is ":8080"'s rule.
	Listen string
	// AllowedHosts are more names (or IP addresses) that the Host check
	// allows, without a port; AllowAnyHost ("*") as the only item turns
	// the check off. Other calls and pages are never Host-checked.
	AllowedHosts []string
	// ConfigVersion is the configuration's version GET /cluster shows until
	// Handler.SetRules gives another.
	ConfigVersion ConfigVersion
	// Members says how GET /status?scope=cluster reaches the other
	// members' GET /status; the zero value asks them over plain HTTP on
	// the port of Listen.
	Members MembersConfig
}

// Validate reports the first problem with c. Zero values are valid: they
// stand for the defaults.
func (c Config) Validate() error {
	if c.MaxBatch < 0 || c.MaxBatch > MaxBatchLimit {
		return fmt.Errorf("max batch: %w: %d must be 1 to %d (0 means %d)", ErrInvalidConfig, c.MaxBatch, MaxBatchLimit, MaxBatchLimit)
	}
	if c.MaxRequestBytes < 0 {
		return fmt.Errorf("max request bytes: %w: %d must be > 0 (0 means %d)", ErrInvalidConfig, c.MaxRequestBytes, DefaultMaxRequestBytes)
	}
	for _, r := range c.AdminToken {
		if r <= ' ' || r > '~' {
			return fmt.Errorf("admin token: %w: only printable ASCII without spaces may go in an Authorization header", ErrInvalidConfig)
		}
	}
	if c.MaxInlinePeriod < 0 || (c.MaxInlinePeriod > 0 && c.MaxInlinePeriod < algorithms.MinPeriod) || c.MaxInlinePeriod > algorithms.MaxPeriod {
		return fmt.Errorf("max inline period: %w: %s must be %s to %s (0 means %s)", ErrInvalidConfig, c.MaxInlinePeriod, algorithms.MinPeriod, algorithms.MaxPeriod, DefaultMaxInlinePeriod)
	}
	if c.Members.APIPort < 0 || c.Members.APIPort > 65535 {
		return fmt.Errorf("members' API port: %w: %d must be 1 to 65535 (0 means the port of the listen address)", ErrInvalidConfig, c.Members.APIPort)
	}
	for _, h := range c.AllowedHosts {
		if err := validAllowedHost(h, len(c.AllowedHosts)); err != nil {
			return fmt.Errorf("allowed hosts: %w: %w", ErrInvalidConfig, err)
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.MaxBatch == 0 {
		c.MaxBatch = MaxBatchLimit
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.MaxInlinePeriod == 0 {
		c.MaxInlinePeriod = DefaultMaxInlinePeriod
	}
	return c
}

// ConfigVersion identifies the configuration a server runs, as GET
// /cluster shows it. The zero value shows nothing known.
type ConfigVersion struct {
	// Generation counts the configurations applied since the process
	// started: 1 at start, +1 per reload applied.
	Generation int64
	// Hash identifies the configuration's source, e.g. the hex SHA-256 of
	// the config file; empty without one.
	Hash string
	// LoadedAt is when it was applied.
	LoadedAt time.Time
}
