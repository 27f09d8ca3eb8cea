package cache

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrInvalidConfig is wrapped by every error DeniedConfig.Validate returns.
var ErrInvalidConfig = errors.New("invalid config")

// Bounds and defaults of DeniedConfig.
const (
	// DefaultDeniedEntries is the size of a Denied cache whose config sets
	// neither MaxEntries nor MaxBytes.
	DefaultDeniedEntries = 100_000
	// MaxDeniedEntries bounds MaxEntries. It guards against typos, not
	// against a sane large cache: the admission counters alone take about
	// 30 bytes per entry up front (see DeniedConfig), so 2^30 entries
	// already reserve some 32 GiB.
	MaxDeniedEntries = 1 << 30
	// MinDeniedBytes is the smallest MaxBytes: room for a few entries.
	MinDeniedBytes = 1 << 10
	// MaxDeniedBytes bounds MaxBytes, for the same reason as
	// MaxDeniedEntries and to the same number of typical entries.
	MaxDeniedBytes = MaxDeniedEntries * typicalEntryBytes
)

// Memory accounting of one entry when the cache is sized in bytes.
const (
	// entryBytes is the entry itself; its Key's strings are counted
	// separately (Add copies them, so the entry owns exactly their bytes).
	entryBytes = int64(unsafe.Sizeof(entry{}))
	// ristrettoItemBytes is what ristretto keeps per item besides the value:
	// a slot in its sharded map (hash, conflict hash, value pointer,
	// expiration: 48 bytes), a slot in its expiration buckets and one in its
	// eviction policy's cost map (16 bytes each), all in Go maps that run
	// between half and seven-eighths full. Measured with ristretto v2.4.2
	// and Go 1.26 over 10^4 to 10^6 items, an entry with empty strings
	// costs 130 to 210 bytes on top of its own allocation (then 96 bytes;
	// now 128, still the 128-byte class); 160 is
	// the middle. ristretto's own estimate (IgnoreInternalCost false) adds
	// only its 56-byte item struct, so Denied turns that off and adds this
	// instead.
	ristrettoItemBytes = 160
	// typicalKeyBytes is the assumed len(Policy)+len(Key) used only to
	// size the admission counters from MaxBytes; the real lengths are
	// charged per entry.
	typicalKeyBytes = 32
	// typicalEntryBytes is the cost of an entry with typicalKeyBytes.
	typicalEntryBytes = entryBytes + ristrettoItemBytes + typicalKeyBytes
)

// DeniedConfig sizes a Denied cache, in entries or in bytes: at most one of
// MaxEntries and MaxBytes may be set. The zero value is valid and means
// DefaultDeniedEntries (100,000) entries.
//
// Besides the entries, ristretto allocates its admission counters up front:
// NumCounters is ten times the expected number of entries (ristretto's
// advice), rounded up to a power of two, at about 3 bytes each. With
// MaxBytes the expected number of entries is MaxBytes divided by the cost of
// an entry whose policy and key total 32 bytes. These counters are not part
// of MaxBytes, which bounds the entries.
type DeniedConfig struct {
	// MaxEntries is the most entries the cache holds, 1 to
	// MaxDeniedEntries; each entry costs 1. 0 means unset.
	MaxEntries int64
	// MaxBytes bounds the estimated memory of the cache's entries, in bytes,
	// MinDeniedBytes to MaxDeniedBytes. Each entry is charged its own size,
	// the length of its policy name and key, and ristretto's per-item
	// bookkeeping (about 250 bytes plus the two strings). 0 means unset.
	MaxBytes int64
}

// Validate reports the first problem with c, naming the field.
func (c DeniedConfig) Validate() error {
	if c.MaxEntries != 0 && c.MaxBytes != 0 {
		return fmt.Errorf("max entries and max bytes: %w: set at most one (max entries %d, max bytes %d)", ErrInvalidConfig, c.MaxEntries, c.MaxBytes)
	}
	if c.MaxEntries < 0 || c.MaxEntries > MaxDeniedEntries {
		return fmt.Errorf("max entries: %w: %d must be 1 to %d (0 means unset)", ErrInvalidConfig, c.MaxEntries, int64(MaxDeniedEntries))
	}
	if c.MaxBytes != 0 && (c.MaxBytes < MinDeniedBytes || c.MaxBytes > MaxDeniedBytes) {
		return fmt.Errorf("max bytes: %w: %d must be %d to %d (0 means unset)", ErrInvalidConfig, c.MaxBytes, int64(MinDeniedBytes), int64(MaxDeniedBytes))
	}
	return nil
}

func (c DeniedConfig) withDefaults() DeniedConfig {
	if c.MaxEntries == 0 && c.MaxBytes == 0 {
		c.MaxEntries = DefaultDeniedEntries
	}
	return c
}

// byBytes reports whether entries are charged in bytes rather than 1 each.
func (c DeniedConfig) byBytes() bool { return c.MaxBytes != 0 }

// maxCost is ristretto's MaxCost: the budget in entries or bytes.
func (c DeniedConfig) maxCost() int64 {
	if c.byBytes() {
		return c.MaxBytes
	}
	return c.MaxEntries
}

// numCounters is ristretto's NumCounters: ten times the expected number of
// entries.
func (c DeniedConfig) numCounters() int64 {
	expected := c.MaxEntries
	if c.byBytes() {
		expected = max(1, c.MaxBytes/typicalEntryBytes)
	}
	return 10 * expected
}

// entryCost is what one entry for k is charged against maxCost.
func (c DeniedConfig) entryCost(k Key) int64 {
	if !c.byBytes() {
		return 1
	}
	return entryBytes + ristrettoItemBytes + int64(len(k.Policy)+len(k.Key))
}
