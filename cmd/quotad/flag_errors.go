package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
)

// This file turns the flag package's errors into one line that says how
// to fix the command: the flag a mistyped one was probably meant to be.

// flagError is err, from parsing fs, said as quotad says it. all are
// quotad's settings, whose config file keys count as spellings of their
// flags (nearestFlag).
func flagError(err error, fs *flag.FlagSet, all []setting) error {
	name, unknown := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !unknown {
		return errors.New(strings.Replace(err.Error(), "flag: ", "", 1) + " (quotad --help lists every flag)")
	}
	if near := nearestFlag(name, fs, all); near != "" {
		return fmt.Errorf("unknown flag --%s; did you mean --%s? (quotad --help lists every flag)", name, near)
	}
	return fmt.Errorf("unknown flag --%s (quotad --help lists every flag)", name)
}

// nearestFlag is the flag of fs closest to name by edit distance, if it is
// close enough to be a typo (at most a third of name's length), else "".
// A setting's config file key written as a flag (redis.url as redis-url)
// is a spelling of its flag too: it is a natural guess at the flag, and
// without it --redis-url (or --redis-ur) would be nearest to --redis-db.
func nearestFlag(name string, fs *flag.FlagSet, all []setting) string {
	best, bestDist := "", len(name)/3+1
	consider := func(spelling, flagName string) {
		if d := editDistance(name, spelling); d < bestDist || (d == bestDist && best != "" && flagName < best) {
			best, bestDist = flagName, d
		}
	}
	fs.VisitAll(func(f *flag.Flag) { consider(f.Name, f.Name) })
	asFlag := strings.NewReplacer(".", "-", "_", "-")
	for _, s := range all {
		consider(asFlag.Replace(s.file), s.flag)
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
