package server

import (
	"context"
	"errors"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// undecodable is the proto codec with one change: a request that does not
// decode (bad wire bytes, a string field that is not UTF-8) is answered
// INVALID_ARGUMENT naming the problem, where grpc-go alone answers
// INTERNAL. The codec lets the message through and remembers its error; the
// interceptors below refuse it before any handler sees it.
type undecodable struct {
	encoding.CodecV2
	failed sync.Map // request pointer -> decode error
}

func newUndecodable() *undecodable {
	return &undecodable{CodecV2: encoding.GetCodecV2("proto")}
}

// Unmarshal decodes v, recording instead of returning a decode error.
func (c *undecodable) Unmarshal(data mem.BufferSlice, v any) error {
	if err := c.CodecV2.Unmarshal(data, v); err != nil {
		field := "request"
		if m, ok := v.(proto.Message); ok {
			if path := badUTF8(m.ProtoReflect().Descriptor(), data.Materialize(), ""); path != "" {
				field = path
				err = errors.New("must be valid UTF-8")
			}
		}
		c.failed.Store(v, [2]string{field, err.Error()})
	}
	return nil
}

// check returns INVALID_ARGUMENT when req failed to decode, forgetting it.
func (c *undecodable) check(req any) error {
	if f, ok := c.failed.LoadAndDelete(req); ok {
		fr := f.([2]string)
		if fr[0] == "request" {
			return invalid("request", "cannot be decoded: "+fr[1])
		}
		return invalid(fr[0], fr[1])
	}
	return nil
}

// badUTF8 finds the path (call.tenant) of the first string field in b
// that is not UTF-8, or "".
func badUTF8(md protoreflect.MessageDescriptor, b []byte, prefix string) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return ""
		}
		val := b[:m]
		b = b[m:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			continue
		}
		inner, k := protowire.ConsumeBytes(val)
		if k < 0 {
			return ""
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(inner) {
				return prefix + string(fd.Name())
			}
		case protoreflect.MessageKind:
			if path := badUTF8(fd.Message(), inner, prefix+string(fd.Name())+"."); path != "" {
				return path
			}
		}
	}
	return ""
}

func (c *undecodable) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := c.check(req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (c *undecodable) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, checkedStream{ss, c})
	}
}

type checkedStream struct {
	grpc.ServerStream
	c *undecodable
}

func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.c.check(m)
}
