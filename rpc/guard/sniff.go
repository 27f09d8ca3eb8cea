package guard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"mime"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http2/hpack"
)

// This file reads a connection up to its first request, for the
// splitter (split.go) to route it.
//
// An HTTP/2 connection opens with the client's preface and SETTINGS; the
// content-type of its first request is in the first HEADERS frame after
// them. grpc-go clients send nothing more before the server's SETTINGS
// arrive, so the splitter sends an empty SETTINGS frame itself, reads up to
// the first request's headers, and hands the connection on with everything
// it read replayed in front, except the client's acknowledgement of that
// frame, which the real server never asked for (net/http's HTTP/2 server
// hangs up on an unexpected one): dropped where the splitter reads it, or,
// when the client sends it after its first request, by the connection
// handed on (ackDropper).
//
// What the splitter holds of a connection is bounded in bytes and in time,
// since it holds it before any server's own bounds apply: at most
// maxSniffBytes (16 KiB), in one buffer that is the replay itself, and
// only until the read-header timeout from the connection's start, by when
// the first request's headers must have ended. A connection past either
// bound gets a GOAWAY saying which, and is closed. An HTTP/2 connection
// that opens no stream is idle as net/http sees it: after the idle timeout,
// if that is sooner, the splitter sends it a GOAWAY and closes it, as
// net/http would.

const (
	// maxSniffBytes bounds what the splitter holds of one HTTP/2
	// connection before it knows the connection's front end: the preface,
	// the frames before the first request, and that request's header
	// block. A first request's headers are rarely over a kilobyte or two
	// (a large bearer token and trace context included); the bound keeps
	// a connection that never finishes them to 16 KiB, where it used to
	// hold up to 1 MiB twice over (RSS grew by 3.8 MB per connection).
	maxSniffBytes = 16 << 10
	// maxFrameSize is the largest frame a client may send before the server
	// allows more: the HTTP/2 default, which the splitter's empty SETTINGS
	// leaves in force.
	maxFrameSize = 1 << 14
)

// emptySettings is a SETTINGS frame with no parameters, on stream 0.
var emptySettings = [h2FrameHeaderLen]byte{0, 0, 0, h2FrameSettings, 0, 0, 0, 0, 0}

// sniff reads c until it knows whether c carries gRPC: an HTTP/2
// connection whose first request's content-type is application/grpc or
// application/grpc+proto (what grpc-go serves). Everything else — HTTP/1,
// and HTTP/2 with Connect, gRPC-Web, JSON or gRPC with another codec — is
// not. replay is c with what sniff read in front of the rest.
//
// sniff reads until deadline, the read-header timeout from the
// connection's start (the caller has set it on c), except that an HTTP/2 connection that opens
// no stream is idle as net/http sees it and has at most idle after its
// preface. It holds at most maxSniffBytes of c: an HTTP/2 connection whose
// first request's headers (with the frames before them) take more is sent
// a GOAWAY saying so and refused. Past the deadline, a connection with no
// stream gets a GOAWAY (NO_ERROR), as net/http sends an idle one; one in
// the middle of its first request's headers a GOAWAY naming the timeout.
// An error means c should be closed.
func sniff(c net.Conn, deadline time.Time, idle time.Duration) (isGRPC bool, replay net.Conn, err error) {
	buf := make([]byte, 0, 4096)
	for len(buf) < len(h2Preface) {
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if !strings.HasPrefix(h2Preface, string(buf[:min(len(buf), len(h2Preface))])) {
			// HTTP/1 (or garbage, for net/http to refuse)
			return false, &replayConn{Conn: c, pending: buf}, nil
		}
		if err != nil {
			return false, nil, fmt.Errorf("read the HTTP/2 preface: %w", err)
		}
	}
	if _, err := c.Write(emptySettings[:]); err != nil {
		return false, nil, fmt.Errorf("write SETTINGS: %w", err)
	}
	// The read-header deadline stays for a connection that starts a
	// request; one that opens no stream is idle, and may not stay idle
	// past the idle timeout either.
	idleDeadline := time.Now().Add(idle)
	s := frameSniffer{buf: buf, at: len(h2Preface)}
	for !s.gotHeaders {
		err := s.step()
		if errors.Is(err, errNeedMore) {
			readBy := deadline
			if !s.inHeaders && idleDeadline.Before(deadline) {
				readBy = idleDeadline
			}
			_ = c.SetReadDeadline(readBy)
			err = s.read(c)
			if err != nil && !errors.Is(err, errSniffTooLarge) && !errors.Is(err, os.ErrDeadlineExceeded) {
				return false, nil, fmt.Errorf("read the first request: %w", err)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, errSniffTooLarge):
			refuse(c, h2EnhanceYourCalm, err.Error())
			return false, nil, err
		case errors.Is(err, os.ErrDeadlineExceeded) && !s.inHeaders:
			// Idle, with no stream: as net/http's HTTP/2 server would,
			// say so before closing.
			refuse(c, 0, "")
			return false, nil, fmt.Errorf("no request within the idle or read-header timeout: sent GOAWAY: %w", err)
		case errors.Is(err, os.ErrDeadlineExceeded):
			refuse(c, h2EnhanceYourCalm, errHeadersTooSlow.Error())
			return false, nil, fmt.Errorf("%w: %w", errHeadersTooSlow, err)
		default:
			return false, nil, err
		}
	}
	rc := &replayConn{Conn: c}
	if s.gotAck {
		rc.pending = s.buf
	} else {
		// The client sends its acknowledgement after its first request:
		// it is still to come, maybe among the bytes read already.
		rc.ack = &ackDropper{out: s.buf[:s.at:s.at]}
		rc.ack.feed(s.buf[s.at:])
	}
	return isGRPCContentType(s.contentType), rc, nil
}

// refuse tells an HTTP/2 client why its connection closes: a GOAWAY with
// code and debug, written within a second (a client that reads nothing
// does not hold the splitter).
func refuse(c net.Conn, code uint32, debug string) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(goAwayFrame(0, code, debug))
}

var (
	errNeedMore      = errors.New("need more bytes")
	errSniffTooLarge = fmt.Errorf("the first request's headers, with the frames before them, take more than %d bytes, "+
		"the most quotad reads before it picks the connection's front end: send less on the first request, or serve with --grpc-transport=connect", maxSniffBytes)
	errHeadersTooSlow = errors.New("the first request's headers did not end within the read-header timeout (--read-header-timeout)")
)

// frameSniffer reads HTTP/2 frames after the preface until it has the
// first HEADERS frame's whole header block and its content-type, dropping
// the client's first SETTINGS acknowledgement if it comes before. It keeps
// one buffer of at most maxSniffBytes, which it hands on for replay: the
// acknowledgement is dropped by moving what follows over it, and the
// header block is decoded fragment by fragment as its frames arrive,
// never copied.
type frameSniffer struct {
	// buf holds the preface and the frames to replay, buf[:at], then
	// bytes read but not yet parsed.
	buf []byte
	at  int
	// dec decodes the first header block; nil until its HEADERS frame.
	dec         *hpack.Decoder
	contentType string
	inHeaders   bool // a HEADERS frame without END_HEADERS was read
	gotHeaders  bool // the first header block is complete
	gotAck      bool
}

// read reads more of c into s.buf, growing it up to maxSniffBytes, and
// returns errSniffTooLarge when it is full.
func (s *frameSniffer) read(c net.Conn) error {
	if len(s.buf) == cap(s.buf) {
		if cap(s.buf) >= maxSniffBytes {
			return errSniffTooLarge
		}
		grown := make([]byte, len(s.buf), min(2*cap(s.buf), maxSniffBytes))
		copy(grown, s.buf)
		s.buf = grown
	}
	n, err := c.Read(s.buf[len(s.buf):cap(s.buf)])
	s.buf = s.buf[:len(s.buf)+n]
	if n > 0 {
		return nil
	}
	return err
}

// step parses one frame from s.buf[s.at:], or returns errNeedMore.
func (s *frameSniffer) step() error {
	p := s.buf[s.at:]
	if len(p) < h2FrameHeaderLen {
		return errNeedMore
	}
	length := int(p[0])<<16 | int(p[1])<<8 | int(p[2])
	typ, flags := p[3], p[4]
	if length > maxFrameSize {
		return fmt.Errorf("a %d-byte frame, over the %d the client may send", length, maxFrameSize)
	}
	if s.at+h2FrameHeaderLen+length > maxSniffBytes {
		return errSniffTooLarge
	}
	if len(p) < h2FrameHeaderLen+length {
		return errNeedMore
	}
	frame, payload := p[:h2FrameHeaderLen+length], p[h2FrameHeaderLen:h2FrameHeaderLen+length]
	streamID := binary.BigEndian.Uint32(frame[5:9]) & (1<<31 - 1)
	switch {
	case typ == h2FrameSettings && flags&h2FlagAck != 0 && !s.gotAck:
		// The acknowledgement of the splitter's own SETTINGS, the first
		// the client sends: the real server did not send that frame.
		s.gotAck = true
		s.buf = append(s.buf[:s.at], s.buf[s.at+len(frame):]...)
		return nil
	case s.inHeaders && typ != h2FrameContinuation:
		return errors.New("a header block interrupted by another frame")
	case typ == h2FrameHeaders && !s.gotHeaders:
		fragment, err := headersFragment(flags, payload)
		if err != nil {
			return err
		}
		if streamID == 0 {
			return errors.New("HEADERS on stream 0")
		}
		s.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
			if f.Name == "content-type" && s.contentType == "" {
				s.contentType = f.Value
			}
		})
		s.dec.SetMaxStringLength(maxSniffBytes)
		if err := s.decode(fragment, flags); err != nil {
			return err
		}
	case typ == h2FrameContinuation && s.inHeaders:
		if err := s.decode(payload, flags); err != nil {
			return err
		}
	}
	s.at += len(frame)
	return nil
}

// decode feeds a fragment of the first header block to the decoder.
func (s *frameSniffer) decode(fragment []byte, flags byte) error {
	if _, err := s.dec.Write(fragment); err != nil {
		return fmt.Errorf("decode the first request's headers: %w", err)
	}
	s.inHeaders = flags&h2FlagEndHeaders == 0
	if s.inHeaders {
		return nil
	}
	s.gotHeaders = true
	err := s.dec.Close()
	s.dec = nil
	if err != nil {
		return fmt.Errorf("decode the first request's headers: %w", err)
	}
	return nil
}

// headersFragment strips a HEADERS frame's padding and priority fields.
func headersFragment(flags byte, p []byte) ([]byte, error) {
	pad := 0
	if flags&h2FlagPadded != 0 {
		if len(p) < 1 {
			return nil, errors.New("HEADERS too short for its padding")
		}
		pad, p = int(p[0]), p[1:]
	}
	if flags&h2FlagPriority != 0 {
		if len(p) < 5 {
			return nil, errors.New("HEADERS too short for its priority")
		}
		p = p[5:]
	}
	if pad > len(p) {
		return nil, errors.New("HEADERS padding longer than the frame")
	}
	return p[:len(p)-pad], nil
}

// isGRPCContentType reports whether grpc-go serves requests of content
// type ct: gRPC with the protobuf codec, which is all it has. gRPC with
// JSON stays with connect-go, which has both.
func isGRPCContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/grpc" || mt == "application/grpc+proto"
}
