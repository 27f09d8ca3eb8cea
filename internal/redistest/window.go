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
// key (algorithms.Keys) is key: that key, or for a window algorithm (key
// ends in ":fw4" or ":sc4", the prefix of its windows' keys) the key of
// one of its windows.
func (s *Server) HoldsState(key string) (bool, error) {
	if strings.HasSuffix(key, ":fw4") || strings.HasSuffix(key, ":sc4") {
		keys, err := s.DoList("KEYS", key+":*")
		return len(keys) > 0, err
	}
	n, err := s.Do("EXISTS", key)
	return n == "1", err
}
