package topkeys

import "slices"

// Merge adds up reports of one policy made by several trackers, one per
// member of a cluster, into the report of the cluster as a whole, keeping
// at most top keys (all of them when top ≤ 0).
//
// Denials add up exactly. A key listed by some reports counts, in each
// report, its Count where listed and the report's Unlisted where not:
// Count is then an upper bound of the key's true denials across the
// reports, and Count − Error a lower bound (the sum of its lower bounds
// where listed, zero elsewhere). So a merged key's Error is the sum, over
// the reports, of its Error where listed and of Unlisted where not; it is
// 0 when every report counted the key exactly or listed every key it saw.
// The merged Unlisted bounds any key the merge does not list: the sum of
// the reports' Unlisted, or the first count cut by top if higher.
//
// Merge does not modify tops; Policy is the policy's name.
func Merge(policy string, tops []PolicyTop, top int) PolicyTop {
	type bound struct{ upper, lower uint64 }
	out := PolicyTop{Policy: policy}
	byKey := map[string]*bound{}
	var unlisted uint64
	for _, t := range tops {
		out.Denials += t.Denials
		unlisted += t.Unlisted
		for _, e := range t.Keys {
			if byKey[e.Key] == nil {
				byKey[e.Key] = &bound{}
			}
		}
	}
	for _, t := range tops {
		listed := make(map[string]Entry, len(t.Keys))
		for _, e := range t.Keys {
			listed[e.Key] = e
		}
		for k, b := range byKey {
			if e, ok := listed[k]; ok {
				b.upper += e.Count
				b.lower += e.Count - min(e.Error, e.Count)
			} else {
				b.upper += t.Unlisted
			}
		}
	}
	entries := make([]Entry, 0, len(byKey))
	for k, b := range byKey {
		entries = append(entries, Entry{Key: k, Count: b.upper, Error: b.upper - b.lower})
	}
	slices.SortFunc(entries, byCountThenKey)
	out.Unlisted = unlisted
	if top > 0 && len(entries) > top {
		out.Unlisted = max(unlisted, entries[top].Count)
		entries = entries[:top]
	}
	out.Keys = entries
	return out
}
