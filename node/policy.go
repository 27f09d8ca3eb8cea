package node

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/quotad/quotad/algorithms"
)

// This file is the domain of a check: Policy, FailureMode, Source, the
// rules for policy names and keys, and the package's errors.

// FailureMode says what a check does when the authoritative store fails.
type FailureMode int

const (
	// FailDefault defers to Config.DefaultFailureMode.
	FailDefault FailureMode = iota
	// FailOpen allows the request, marked SourceFailOpen: an outage of the
	// limiter never takes the API down.
	FailOpen
	// FailClosed denies the request, marked SourceFailClosed: an outage never
	// lets unlimited traffic through.
	FailClosed
)

// String returns "default", "open" or "closed".
func (m FailureMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	case FailDefault:
		return "default"
	}
	return fmt.Sprintf("FailureMode(%d)", int(m))
}

// ParseFailureMode accepts "open" or "closed".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("%w %q (want open or closed)", ErrInvalidFailureMode, s)
}

// Source says which part of the node made a decision.
type Source int

const (
	// SourceStore: the authoritative store decided.
	SourceStore Source = iota + 1
	// SourceLease: units this node had already taken from the store.
	SourceLease
	// SourceDeniedCache: a denial the store gave earlier still holds.
	SourceDeniedCache
	// SourceFailOpen: the store failed and the policy fails open.
	SourceFailOpen
	// SourceFailClosed: the store failed and the policy fails closed.
	SourceFailClosed
)

// String returns the source's lower-case name, e.g. "store".
func (s Source) String() string {
	switch s {
	case SourceStore:
		return "store"
	case SourceLease:
		return "lease"
	case SourceDeniedCache:
		return "denied_cache"
	case SourceFailOpen:
		return "fail_open"
	case SourceFailClosed:
		return "fail_closed"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// Bounds on names and keys.
const (
	// MaxPolicyNameLen is the longest policy name, in bytes.
	MaxPolicyNameLen = 128
	// MaxKeyLen is the longest key, in bytes.
	MaxKeyLen = 1024
)

// Errors of this package; each is wrapped with the field or operation.
// Those about the caller's input (ErrInvalidPolicyName, ErrInvalidKey,
// ErrInvalidFailureMode, and the slot, lease and batch ones beside their
// code) wrap ErrInvalidInput.
var (
	// ErrInvalidInput is algorithms.ErrInvalidInput: what every error about
	// a caller's input wraps, in this package and in package algorithms.
	ErrInvalidInput = algorithms.ErrInvalidInput

	ErrInvalidPolicyName  = algorithms.NewInputError("invalid policy name")
	ErrInvalidKey         = algorithms.NewInputError("invalid key")
	ErrUnknownPolicy      = errors.New("unknown policy")
	ErrInvalidFailureMode = algorithms.NewInputError("invalid failure mode")
	ErrDuplicatePolicy    = errors.New("duplicate policy")
	ErrInvalidConfig      = errors.New("invalid config")
	// ErrStore is what Node's methods (Reset, a slot's renew or release)
	// return when the authoritative store failed or did not answer in
	// time, whatever the cause: a timeout, a Redis error, or the breaker
	// being open (ErrBreakerOpen, which only stores return). It hides the
	// store's own error identity (a store timeout is not the caller's
	// context.DeadlineExceeded); the detail stays in the text.
	ErrStore = errors.New("store unavailable")
)

// Policy is a named limit and what to do when the store fails. It is a
// value; the zero value is invalid.
//
// A Policy is validated once, where it enters: NewPolicy validates one,
// and Config.Validate and SetPolicies the configured ones, which the
// node's PolicySet then holds. Node's methods trust a Policy that came
// from either (Node.Policy, PolicySet.Policy, NewPolicy) without
// validating it again, and validate any other value, such as a literal
// Policy{...}, on every call. A validated Policy must not be changed
// field by field: build the changed one with NewPolicy.
type Policy struct {
	// Name is 1 to MaxPolicyNameLen characters of [A-Za-z0-9_.-]. For an
	// inline limit it is the namespace the request named.
	Name string
	// Limit is the rate limit.
	Limit algorithms.Limit
	// OnStoreError is the failure mode; FailDefault defers to the node's.
	OnStoreError FailureMode
	// Lease switches leases for this policy: LeaseAuto (the zero value) or
	// LeaseOff.
	Lease LeaseMode

	// valid marks a Policy that NewPolicy or the policy set validated.
	valid bool
}

// NewPolicy returns p validated: the first problem Validate finds, or p
// marked so that Node's methods trust it without validating it again.
// Build a policy with it where the policy enters a program (a request, a
// configuration) and pass the result to every check.
func NewPolicy(p Policy) (Policy, error) {
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	p.valid = true
	return p, nil
}

// validated returns p as NewPolicy does, without validating again a
// policy that already was.
func (p Policy) validated() (Policy, error) {
	if p.valid {
		return p, nil
	}
	return NewPolicy(p)
}

// Validate reports the first problem with p, naming the field.
func (p Policy) Validate() error {
	if err := ValidatePolicyName(p.Name); err != nil {
		return err
	}
	if err := p.Limit.Validate(); err != nil {
		return err
	}
	switch p.OnStoreError {
	case FailDefault, FailOpen, FailClosed:
	default:
		return fmt.Errorf("on_store_error: %w %d", ErrInvalidFailureMode, int(p.OnStoreError))
	}
	if p.Lease != LeaseAuto && p.Lease != LeaseOff {
		return fmt.Errorf("lease: %w: mode %d", ErrInvalidConfig, int(p.Lease))
	}
	return nil
}

// ValidatePolicyName reports whether name is a usable policy name or inline
// namespace. The character set keeps Redis keys unambiguous: a name never
// contains the ':' that separates it from the key.
func ValidatePolicyName(name string) error {
	if name == "" {
		return fmt.Errorf("policy: %w: must not be empty", ErrInvalidPolicyName)
	}
	if len(name) > MaxPolicyNameLen {
		return fmt.Errorf("policy: %w: %d bytes exceeds %d", ErrInvalidPolicyName, len(name), MaxPolicyNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("policy: %w: %q has %s at byte %d; use A-Z a-z 0-9 _ . -", ErrInvalidPolicyName, name, quoteCharAt(name, i), i)
		}
	}
	return nil
}

// quoteCharAt quotes the character that starts at byte i of s as a Go rune
// literal: the whole UTF-8 sequence ('П', not the 'Ð' of its first byte),
// or the lone byte ('\xff') where s is not valid UTF-8.
func quoteCharAt(s string, i int) string {
	r, size := utf8.DecodeRuneInString(s[i:])
	if r == utf8.RuneError && size <= 1 {
		return fmt.Sprintf(`'\x%02x'`, s[i])
	}
	return fmt.Sprintf("%q", r)
}

// ValidateKey reports whether key is a usable key: 1 to MaxKeyLen bytes.
// Any bytes are allowed; the key is passed to Redis as a key, never spliced
// into script text.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("key: %w: must not be empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("key: %w: %d bytes exceeds %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}
