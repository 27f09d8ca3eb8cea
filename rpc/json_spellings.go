package rpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// This file takes, in the HTTP/JSON API, the spellings a person writes
// from quotad's config file where protobuf's JSON wants its own: an
// algorithm named as in the config file ("fixed_window" for
// ALGORITHM_FIXED_WINDOW), and a period as a Go duration ("1m", "1h30m")
// or a number of seconds (60) where protobuf wants "60s". A request whose
// JSON protobuf refuses is read again with those spellings respelled; one
// that still does not read is refused with what each field accepts.

// durationFields are the request fields that are durations.
var durationFields = map[string]bool{"period": true}

// respell returns data with the config file's spellings of algorithms and
// durations respelled as protobuf's JSON spells them, and whether it
// changed anything.
func respell(data []byte) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return data, false
	}
	changed := false
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				switch {
				case k == "algorithm":
					if s, ok := e.(string); ok {
						if a, err := algorithms.ParseAlgorithm(strings.ToLower(s)); err == nil {
							x[k], changed = "ALGORITHM_"+strings.ToUpper(a.String()), true
							continue
						}
					}
				case durationFields[k]:
					if d, ok := asDuration(e); ok {
						x[k], changed = strconv.FormatFloat(d.Seconds(), 'f', -1, 64)+"s", true
						continue
					}
				}
				x[k] = walk(e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		}
		return v
	}
	v = walk(v)
	if !changed {
		return data, false
	}
	out, err := json.Marshal(v)
	if err != nil {
		return data, false
	}
	return out, true
}

// asDuration reads a number of seconds, or a Go duration string that is
// not already protobuf's ("60s" is left as it is).
func asDuration(v any) (time.Duration, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		if err != nil || f < 0 {
			return 0, false
		}
		return time.Duration(f * float64(time.Second)), true
	case string:
		if _, err := strconv.ParseFloat(strings.TrimSuffix(x, "s"), 64); err == nil && strings.HasSuffix(x, "s") {
			return 0, false // protobuf's own spelling
		}
		d, err := time.ParseDuration(x)
		return d, err == nil && d >= 0
	}
	return 0, false
}

// spellingHint says what protobuf's JSON accepts for the field err, its
// refusal of a request, is about; "" when it is about something else.
func spellingHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "enum field algorithm"):
		var names []string
		for _, a := range append(algorithms.Algorithms(), algorithms.Concurrency) {
			names = append(names, fmt.Sprintf("ALGORITHM_%s (%s)", strings.ToUpper(a.String()), a))
		}
		return "algorithm: write one of " + strings.Join(names, ", ")
	case strings.Contains(msg, "google.protobuf.Duration"), strings.Contains(msg, "unexpected token") && strings.Contains(msg, "period"):
		return `period: write a duration such as "60s" (protobuf's JSON), "1m" or "1h30m", or a number of seconds`
	}
	return ""
}
