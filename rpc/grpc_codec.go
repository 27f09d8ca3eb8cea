package rpc

import (
	"errors"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// grpc-go answers a request message that does not decode with Internal,
// and writes that status itself before the method sees the error. The
// Connect front end answers InvalidArgument ("unmarshal message: ..."):
// the fault is the client's. So that a client gets one answer from either
// front end, the gRPC front end's codec hands the API's methods the
// decoding's error instead of failing, and the method answers as Connect
// does (decodeError).

// grpcRequest is what an API method's request decodes into: msg, and err
// when msg did not decode.
type grpcRequest struct {
	msg proto.Message
	err error
	// maxBytes, when above 0, bounds the message: a larger one is not
	// decoded and its size is set instead.
	maxBytes int
	size     int
}

// grpcCodec is grpc-go's protobuf codec, except that it decodes a
// grpcRequest without failing. It is stateless and safe for concurrent use.
type grpcCodec struct {
	proto encoding.CodecV2
}

var _ encoding.CodecV2 = grpcCodec{}

// newGRPCCodec wraps grpc-go's registered protobuf codec.
func newGRPCCodec() (grpcCodec, error) {
	c := encoding.GetCodecV2(grpcproto.Name)
	if c == nil {
		return grpcCodec{}, errors.New("grpc-go's protobuf codec is not registered")
	}
	return grpcCodec{proto: c}, nil
}

// Name implements encoding.CodecV2.
func (c grpcCodec) Name() string { return grpcproto.Name }

// Marshal implements encoding.CodecV2.
func (c grpcCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

// Unmarshal implements encoding.CodecV2.
func (c grpcCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*grpcRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	if n := data.Len(); r.maxBytes > 0 && n > r.maxBytes {
		r.size = n
		return nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	r.err = proto.Unmarshal(buf.ReadOnlyData(), r.msg)
	return nil
}
