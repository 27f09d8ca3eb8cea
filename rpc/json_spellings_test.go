package rpc

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node/store/memory"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
	"github.com/quotad/quotad/rpc/protoconv"
)

// A JSON request may spell an algorithm and a failure mode as the config
// file does, and a duration as Go does or as a number of seconds; each is
// decided as its protobuf JSON spelling would be. A token bucket of 5 per "1m" refills a unit every
// 12 s, so one check's resetAfter of 12s shows the period was taken as 60s.
func TestJSONTakesTheConfigFileSpellings(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	c := http1Client(t)
	for name, tc := range map[string]struct{ procedure, body, want string }{
		"algorithm and Go duration": {"Check", `{"policy":"demo","key":"a","limit":{"algorithm":"token_bucket","limit":"5","period":"1m"}}`,
			`{"allowed":true,"limit":"5","remaining":"4","resetAfter":"12s","retryAfter":"0s","source":"SOURCE_STORE"}`},
		"failure mode, lowerCamelCase field": {"Check", `{"policy":"demo","key":"b","limit":{"algorithm":"ALGORITHM_TOKEN_BUCKET","limit":"5","period":"60s","onStoreError":"closed"}}`,
			`{"allowed":true,"limit":"5","remaining":"4","resetAfter":"12s","retryAfter":"0s","source":"SOURCE_STORE"}`},
		"composite Go duration": {"Check", `{"policy":"demo","key":"c","limit":{"algorithm":"token_bucket","limit":"5","period":"1m0.5s"}}`,
			`{"allowed":true,"limit":"5","remaining":"4","resetAfter":"12.100s","retryAfter":"0s","source":"SOURCE_STORE"}`},
		"a number of seconds": {"Check", `{"policy":"demo","key":"e","limit":{"algorithm":"token_bucket","limit":"5","period":60}}`,
			`{"allowed":true,"limit":"5","remaining":"4","resetAfter":"12s","retryAfter":"0s","source":"SOURCE_STORE"}`},
		"a fraction of seconds": {"Check", `{"policy":"demo","key":"f","limit":{"algorithm":"token_bucket","limit":"5","period":60.5}}`,
			`{"allowed":true,"limit":"5","remaining":"4","resetAfter":"12.100s","retryAfter":"0s","source":"SOURCE_STORE"}`},
		"in a batch": {"CheckBatch", `{"requests":[{"policy":"demo","key":"d","limit":{"algorithm":"gcra","limit":"5","period":"1m"}}]}`,
			`{"results":[{"response":{"allowed":true,"limit":"5","remaining":"4","resetAfter":"12s","retryAfter":"0s","source":"SOURCE_STORE"}}]}`},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := postJSON(t, c, ts.URL, "/quotad.v1.QuotaService/"+tc.procedure, "application/json", tc.body)
			// protojson varies its whitespace on purpose; compare compacted.
			var compact bytes.Buffer
			if err := json.Compact(&compact, []byte(body)); err == nil {
				body = compact.String()
			}
			if status != http.StatusOK || body != tc.want {
				t.Fatalf("got %d %s, want 200 %s", status, body, tc.want)
			}
		})
	}
}

// A spelling that is neither protobuf's nor the config file's is answered
// with what is accepted, naming the field as the .proto file does, and
// without protojson's words.
func TestJSONMisspellingsSayWhatIsAccepted(t *testing.T) {
	ts := startServer(t, memory.New(nil, 0), Config{})
	c := http1Client(t)
	for name, tc := range map[string]struct{ procedure, body, want, gone string }{
		"period as a number it cannot read": {"Check", `{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":6e1}}`,
			`unmarshal message: limit.period: want a duration such as "60s" (seconds), "1m" or "500ms", or a number of seconds; got the number 6e1`, "unexpected token"},
		"period without a unit": {"Check", `{"policy":"demo","key":"u1","limit":{"algorithm":"ALGORITHM_FIXED_WINDOW","limit":"5","period":"60"}}`,
			`unmarshal message: limit.period: want a duration such as "60s" (seconds), "1m" or "500ms", or a number of seconds; got "60"`, "google.protobuf.Duration"},
		"unknown algorithm": {"Check", `{"policy":"demo","key":"u1","limit":{"algorithm":"leaky","limit":"5","period":"60s"}}`,
			`unmarshal message: limit.algorithm: want one of ALGORITHM_FIXED_WINDOW, ALGORITHM_SLIDING_WINDOW_LOG, ALGORITHM_SLIDING_WINDOW_COUNTER, ALGORITHM_TOKEN_BUCKET, ALGORITHM_LEAKY_BUCKET, ALGORITHM_GCRA, ALGORITHM_CONCURRENCY, or as the config file spells them, fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra, concurrency; got "leaky"`, "invalid value for enum"},
		"upper-case config name": {"Check", `{"policy":"demo","key":"u1","limit":{"algorithm":"FIXED_WINDOW","limit":"5","period":"60s"}}`,
			`limit.algorithm: want one of ALGORITHM_FIXED_WINDOW`, "invalid value for enum"},
		"unspecified": {"Check", `{"policy":"demo","key":"u1","limit":{"algorithm":"unspecified","limit":"5","period":"60s"}}`,
			`limit.algorithm: want one of ALGORITHM_FIXED_WINDOW`, "invalid value for enum"},
		"failure mode": {"Check", `{"policy":"demo","key":"u1","limit":{"algorithm":"gcra","limit":"5","period":"60s","on_store_error":"maybe"}}`,
			`unmarshal message: limit.on_store_error: want one of FAILURE_MODE_OPEN, FAILURE_MODE_CLOSED, or as the config file spells them, open, closed; got "maybe"`, "invalid value for enum"},
		"batch item": {"CheckBatch", `{"requests":[{"policy":"demo","key":"a","limit":{"algorithm":"gcra","limit":"5","period":"1m"}},{"policy":"demo","key":"b","limit":{"algorithm":"gcra","limit":"5","period":"1x"}}]}`,
			`unmarshal message: requests[1].limit.period: want a duration such as "60s" (seconds), "1m" or "500ms", or a number of seconds; got "1x"`, "google.protobuf.Duration"},
	} {
		t.Run(name, func(t *testing.T) {
			status, body := postJSON(t, c, ts.URL, "/quotad.v1.QuotaService/"+tc.procedure, "application/json", tc.body)
			var e struct{ Code, Message string }
			if err := json.Unmarshal([]byte(body), &e); err != nil {
				t.Fatalf("%d %s: %v", status, body, err)
			}
			if status != http.StatusBadRequest || e.Code != "invalid_argument" || !strings.Contains(e.Message, tc.want) || strings.Contains(e.Message, tc.gone) {
				t.Fatalf("got %d %s, want 400 invalid_argument saying %q and not %q", status, body, tc.want, tc.gone)
			}
		})
	}
}

// The config file's name of every algorithm (algorithms.Algorithm.String,
// which the config file parses) is respelt into the enum value that
// protoconv maps to that same algorithm.
func TestConfigFileAlgorithmNamesMapToTheirEnumValues(t *testing.T) {
	ed := quotadv1.Algorithm(0).Descriptor()
	for _, a := range append(algorithms.Algorithms(), algorithms.Concurrency) {
		name, ok := enumByConfigName(ed, a.String())
		if !ok {
			t.Errorf("%s is not respelt", a)
			continue
		}
		if got, ok := protoconv.AlgorithmFromProto(quotadv1.Algorithm(quotadv1.Algorithm_value[name])); !ok || got != a {
			t.Errorf("%s is respelt %s, which maps to %v", a, name, got)
		}
	}
}

// secondsText writes what protojson reads, and protojson reads it as the
// same duration.
func TestSecondsText(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Minute: "60s", 500 * time.Millisecond: "0.5s", -1250 * time.Millisecond: "-1.25s",
		time.Nanosecond: "0.000000001s", 0: "0s", 90*time.Minute + time.Millisecond: "5400.001s",
	} {
		got := secondsText(d)
		if got != want {
			t.Errorf("secondsText(%s) = %q, want %q", d, got, want)
		}
		var l quotadv1.Limit
		if err := (jsonCodec{}).Unmarshal([]byte(`{"period":"`+got+`"}`), &l); err != nil || l.GetPeriod().AsDuration() != d {
			t.Errorf("%q reads as %v, %v; want %s", got, l.GetPeriod().AsDuration(), err, d)
		}
	}
}

// FuzzJSONCodecKeepsProtojsonsMeaning decodes arbitrary bodies with the
// codec: it never panics, a body protojson accepts decodes to exactly what
// protojson makes of it (the respelling never changes a valid request),
// and a body the codec accepts that protojson refuses is one it respelt
// into a body protojson accepts.
func FuzzJSONCodecKeepsProtojsonsMeaning(f *testing.F) {
	for _, s := range []string{
		`{"requests":[{"policy":"demo","key":"a","limit":{"algorithm":"gcra","limit":"5","period":"1m"}}],"allOrNothing":true}`,
		`{"requests":[{"policy":"demo","key":"a","limit":{"algorithm":"ALGORITHM_GCRA","limit":"5","period":"60s","onStoreError":"FAILURE_MODE_OPEN"}}]}`,
		`{"requests":[{"limit":{"period":60}}]}`, `{"requests":[{"limit":{"period":-0.25}}]}`, `{"requests":[{"limit":{"period":"1.5s","algorithm":3}}]}`, `{"requests":null}`, `[]`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got, want quotadv1.CheckBatchRequest
		err := (jsonCodec{}).Unmarshal(body, &got)
		wantErr := protojson.Unmarshal(body, &want)
		switch {
		case wantErr == nil && err != nil:
			t.Fatalf("%s: protojson accepts it, the codec says %v", body, err)
		case wantErr == nil && !proto.Equal(&got, &want):
			t.Fatalf("%s: the codec decoded %v, protojson %v", body, &got, &want)
		case wantErr != nil && err == nil:
			fixed, ferr := respell(body, want.ProtoReflect().Descriptor())
			if ferr != nil || fixed == nil {
				t.Fatalf("%s: accepted without a respelling (%v)", body, ferr)
			}
			var again quotadv1.CheckBatchRequest
			if err := protojson.Unmarshal(fixed, &again); err != nil || !proto.Equal(&again, &got) {
				t.Fatalf("%s: respelt %s, which protojson reads as %v (%v), not %v", body, fixed, &again, err, &got)
			}
		}
	})
}
