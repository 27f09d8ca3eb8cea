package rpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// This file lets a JSON request spell an enum and a duration as a person
// writes them from quotad's config file, and answers a spelling that is
// none of the accepted ones with those, in place of protojson's words. It
// runs only on a body protojson refused, so that every body protojson
// accepts means what it means to protojson. It follows the message's
// descriptor, so that every enum and duration field of every request is
// read alike, and an error names the field as the .proto file does.

// durationName is the full name of google.protobuf.Duration.
const durationName protoreflect.FullName = "google.protobuf.Duration"

// protoDuration matches a duration as protojson writes and reads it:
// seconds, with up to nine decimals, and an s.
var protoDuration = regexp.MustCompile(`^-?[0-9]+(\.[0-9]{1,9})?s$`)

// respell returns data, a JSON body protojson refused for a message of
// md, with the config file's spellings rewritten into protojson's: an enum
// value as the config file writes it ("fixed_window", "open") into its
// name (ALGORITHM_FIXED_WINDOW, FAILURE_MODE_OPEN), and a duration as Go
// writes it ("1m", "1h30m", "500ms") or as a number of seconds (60) into
// protojson's seconds ("60s"). It returns nil
// and no error when there is nothing to rewrite, or when data is not JSON
// at all (protojson's error says where), and an error naming the field
// (as the .proto file spells it: "requests[2].limit.period") and what it
// accepts when an enum or a duration is spelt in no accepted way.
func respell(data []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, nil
	}
	changed := false
	if err := respellMessage(v, md, "", &changed); err != nil {
		return nil, err
	}
	if !changed {
		return nil, nil
	}
	return json.Marshal(v)
}

// respellMessage respells the fields of v, a JSON object for a message of
// md whose fields are named path + their name, in place, and sets changed
// if it rewrote one. Fields md lacks are left for protojson to refuse.
func respellMessage(v any, md protoreflect.MessageDescriptor, path string, changed *bool) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	// In the order of the names, so that of two mistakes the same one is
	// reported every time.
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range obj {
			if !yield(k) {
				return
			}
		}
	}) {
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(k))
		}
		if fd == nil || fd.IsMap() {
			continue
		}
		name := path + string(fd.Name())
		if !fd.IsList() {
			nv, err := respellValue(obj[k], fd, name, changed)
			if err != nil {
				return err
			}
			obj[k] = nv
			continue
		}
		items, ok := obj[k].([]any)
		if !ok {
			continue
		}
		for i := range items {
			nv, err := respellValue(items[i], fd, fmt.Sprintf("%s[%d]", name, i), changed)
			if err != nil {
				return err
			}
			items[i] = nv
		}
	}
	return nil
}

// respellValue returns v, the JSON value of one value of field fd named
// path, respelt (see respell).
func respellValue(v any, fd protoreflect.FieldDescriptor, path string, changed *bool) (any, error) {
	switch {
	case fd.Kind() == protoreflect.EnumKind:
		s, ok := v.(string)
		if !ok || fd.Enum().Values().ByName(protoreflect.Name(s)) != nil {
			return v, nil // a name, or a number, which the service validates
		}
		if name, ok := enumByConfigName(fd.Enum(), s); ok {
			*changed = true
			return name, nil
		}
		return nil, enumSpellingError(fd.Enum(), path, s)
	case fd.Kind() == protoreflect.MessageKind && fd.Message().FullName() == durationName:
		switch x := v.(type) {
		case string:
			if protoDuration.MatchString(x) {
				return v, nil
			}
			if d, err := time.ParseDuration(x); err == nil {
				*changed = true
				return secondsText(d), nil
			}
			return nil, fmt.Errorf(`%s: want a duration such as "60s" (seconds), "1m" or "500ms", or a number of seconds; got %q`, path, x)
		case json.Number:
			// Seconds, read as decimal text: no float rounds them.
			if d, err := time.ParseDuration(x.String() + "s"); err == nil {
				*changed = true
				return secondsText(d), nil
			}
			return nil, fmt.Errorf(`%s: want a duration such as "60s" (seconds), "1m" or "500ms", or a number of seconds; got the number %s`, path, x)
		}
		return v, nil
	case fd.Kind() == protoreflect.MessageKind:
		return v, respellMessage(v, fd.Message(), path+".", changed)
	}
	return v, nil
}

// enumByConfigName returns the name of the value of ed that the config
// file spells s: the name without the enum's prefix, in lower case
// ("fixed_window" for ALGORITHM_FIXED_WINDOW). The zero value
// (…_UNSPECIFIED) has no such spelling.
func enumByConfigName(ed protoreflect.EnumDescriptor, s string) (string, bool) {
	prefix := enumPrefix(ed)
	if s == "" || s != strings.ToLower(s) {
		return "", false
	}
	v := ed.Values().ByName(protoreflect.Name(prefix + strings.ToUpper(s)))
	if v == nil || v.Number() == 0 {
		return "", false
	}
	return string(v.Name()), true
}

// enumSpellingError says that s, the value of enum field path, is no name
// of ed's values, and lists what is: each name and its config file
// spelling.
func enumSpellingError(ed protoreflect.EnumDescriptor, path, s string) error {
	prefix := enumPrefix(ed)
	var names, config []string
	for i := range ed.Values().Len() {
		v := ed.Values().Get(i)
		if v.Number() == 0 {
			continue
		}
		names = append(names, string(v.Name()))
		config = append(config, strings.ToLower(strings.TrimPrefix(string(v.Name()), prefix)))
	}
	return fmt.Errorf("%s: want one of %s, or as the config file spells them, %s; got %q", path, strings.Join(names, ", "), strings.Join(config, ", "), s)
}

// enumPrefix is the prefix every value name of ed starts with, that of its
// zero value without UNSPECIFIED: "ALGORITHM_".
func enumPrefix(ed protoreflect.EnumDescriptor) string {
	return strings.TrimSuffix(string(ed.Values().Get(0).Name()), "UNSPECIFIED")
}

// secondsText is d as protojson writes a duration: seconds, with as many
// decimals as it needs, and an s ("60s", "0.5s", "-1.25s").
func secondsText(d time.Duration) string {
	sign := ""
	abs := uint64(d)
	if d < 0 {
		sign, abs = "-", uint64(-(d+1))+1
	}
	secs, nanos := abs/uint64(time.Second), abs%uint64(time.Second)
	if nanos == 0 {
		return fmt.Sprintf("%s%ds", sign, secs)
	}
	return fmt.Sprintf("%s%d.%ss", sign, secs, strings.TrimRight(fmt.Sprintf("%09d", nanos), "0"))
}
