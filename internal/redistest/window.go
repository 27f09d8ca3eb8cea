package redistest

import (
	"fmt"
	"strconv"
	"strings"
)

// FixedWindowCount returns what a fixed window counts in its newest window
// on s: prefix is the windows' key prefix (algorithms.Keys(FixedWindow,
// base)[0]), each window's key "prefix:period:start" (algorithms.WindowKey)
// holds its count. It returns 0 when no window's key exists.
func (s *Server) FixedWindowCount(prefix string) (int64, error) {
	keys, err := s.DoList("KEYS", prefix+":*")
	if err != nil {
		return 0, err
	}
	newest, start := "", int64(-1)
	for _, k := range keys {
		w, err := strconv.ParseInt(k[strings.LastIndexByte(k, ':')+1:], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("window key %s: %w", k, err)
		}
		if w > start {
			newest, start = k, w
		}
	}
	if newest == "" {
		return 0, nil
	}
	v, err := s.Do("GET", newest)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// HoldsState reports whether s holds the state of an algorithm whose first
// key (algorithms.Keys) is key: that key; for a window algorithm (key
// ends in ":fw4" or ":sc4", the prefix of its windows' keys) the key of
// one of its windows; for a sliding log (key ends in ":sl4", its sorted
// set) that key or its meta key, where a short log lives alone.
func (s *Server) HoldsState(key string) (bool, error) {
	if strings.HasSuffix(key, ":fw4") || strings.HasSuffix(key, ":sc4") {
		keys, err := s.DoList("KEYS", key+":*")
		return len(keys) > 0, err
	}
	if base, ok := strings.CutSuffix(key, ":sl4"); ok {
		n, err := s.Do("EXISTS", key, base+":slm4")
		return n != "0", err
	}
	n, err := s.Do("EXISTS", key)
	return n == "1", err
}

// SlidingLogSum returns the units a sliding log whose meta key
// (algorithms.Keys(SlidingWindowLog, base)[1]) is meta holds on s, expired
// entries included: an inline log's entries' costs ("L<seq> ts:seq:cost
// ..."), its fresh form's one entry ("r<ttl> sum seq ts"), or beside its
// sorted set the "sum seq" it keeps. It returns 0 when meta is missing.
func (s *Server) SlidingLogSum(meta string) (int64, error) {
	v, err := s.Do("GET", meta)
	if err != nil || v == "" {
		return 0, err
	}
	fields := strings.Fields(v)
	switch {
	case strings.HasPrefix(v, "L"):
		sum := int64(0)
		for _, f := range fields[1:] {
			n, err := strconv.ParseInt(f[strings.LastIndexByte(f, ':')+1:], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s holds %q: %w", meta, v, err)
			}
			sum += n
		}
		return sum, nil
	case strings.HasPrefix(v, "r") && len(fields) > 1:
		return strconv.ParseInt(fields[1], 10, 64)
	}
	return strconv.ParseInt(fields[0], 10, 64)
}
