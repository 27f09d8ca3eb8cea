package rpc

import (
	"errors"
	"fmt"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// The codec names connect-go registers for JSON by default. A handler picks
// the codec by the request's content type, and connect-go registers
// "application/json; charset=utf-8" as a codec of its own, so both names
// must be replaced or that content type would keep the default behaviour.
const (
	codecNameJSON            = "json"
	codecNameJSONCharsetUTF8 = codecNameJSON + "; charset=utf-8"
)

// jsonCodecs returns the handler options that replace connect-go's JSON
// codecs with jsonCodec under both of their names.
func jsonCodecs() connect.HandlerOption {
	return connect.WithHandlerOptions(
		connect.WithCodec(jsonCodec{name: codecNameJSON}),
		connect.WithCodec(jsonCodec{name: codecNameJSONCharsetUTF8}),
	)
}

// jsonCodec is the protobuf JSON mapping (protojson) with these differences
// from connect-go's default JSON codec:
//
//   - Marshal emits unpopulated fields, so a denial reads
//     {"allowed":false,"limit":"5","remaining":"0",...} and never {} — a
//     JSON client must not have to know proto3's zero-value rules to tell a
//     denial from a broken response. Field names stay lowerCamelCase
//     ("retryAfter"), as in connect-go's default.
//   - Unmarshal rejects unknown fields (connect-go discards them), so a
//     misspelt field such as "cots" fails with InvalidArgument instead of
//     silently checking the default cost.
//   - Unmarshal also takes the config file's spellings of an enum value
//     ("fixed_window") and Go's or a number of seconds for a duration
//     ("1m", 60), and answers a spelling that is none of those with the
//     accepted ones (respell).
//
// It is stateless and safe for concurrent use.
type jsonCodec struct {
	name string
}

var _ connect.Codec = jsonCodec{}

// Name implements connect.Codec.
func (c jsonCodec) Name() string { return c.name }

// Marshal implements connect.Codec.
func (c jsonCodec) Marshal(message any) ([]byte, error) {
	return c.MarshalAppend(nil, message)
}

// MarshalAppend appends message's JSON to dst; connect-go uses it to reuse
// pooled buffers.
func (c jsonCodec) MarshalAppend(dst []byte, message any) ([]byte, error) {
	m, ok := message.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal %T: not a protobuf message", message)
	}
	return protojson.MarshalOptions{EmitUnpopulated: true}.MarshalAppend(dst, m)
}

// Unmarshal implements connect.Codec. An empty payload is an error, as in
// connect-go's codec: "{}" is the empty message.
func (c jsonCodec) Unmarshal(data []byte, message any) error {
	m, ok := message.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal into %T: not a protobuf message", message)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object; send {} for an empty message")
	}
	err := protojson.Unmarshal(data, m)
	if err == nil {
		return nil
	}
	// Only a body protojson refused is respelt (json_spellings.go): one it
	// accepts means what it means to protojson.
	fixed, respellErr := respell(data, m.ProtoReflect().Descriptor())
	switch {
	case respellErr != nil:
		return respellErr
	case fixed != nil:
		err = protojson.Unmarshal(fixed, m)
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("unmarshal into %T: %w", message, err)
}
