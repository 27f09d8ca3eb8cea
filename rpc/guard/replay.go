package guard

import "net"

// This file hands a connection on to its front end with what the splitter
// read of it (sniff.go) read again first.

// replayConn is a connection whose first bytes, already read by the
// splitter, are read again before the rest; with ack set, the rest passes
// it until it has dropped the client's SETTINGS acknowledgement. Like any
// net.Conn it is read by one goroutine at a time.
type replayConn struct {
	net.Conn
	pending []byte
	ack     *ackDropper // nil: nothing to drop
}

// NetConn returns the connection replayed.
func (c *replayConn) NetConn() net.Conn { return c.Conn }

func (c *replayConn) Read(p []byte) (int, error) {
	if c.ack != nil {
		return c.readDropping(p)
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil // let the buffer go
		}
		return n, nil
	}
	return c.Conn.Read(p)
}

// readDropping reads through c.ack until it has dropped the acknowledgement
// and handed on all it held.
func (c *replayConn) readDropping(p []byte) (int, error) {
	for len(c.ack.out) == 0 {
		if c.ack.dropped {
			c.ack = nil
			return c.Read(p)
		}
		buf := make([]byte, max(len(p), 512))
		n, err := c.Conn.Read(buf)
		if n == 0 {
			return 0, err
		}
		c.ack.feed(buf[:n])
	}
	n := copy(p, c.ack.out)
	c.ack.out = c.ack.out[n:]
	if len(c.ack.out) == 0 && c.ack.dropped {
		c.ack = nil
	}
	return n, nil
}

// ackDropper follows a client's HTTP/2 frames from a frame boundary and
// drops the first SETTINGS acknowledgement among them: the one of the
// splitter's SETTINGS, as a client acknowledges SETTINGS in the order it
// got them. Everything else goes to out unchanged, a frame header only
// once whole.
type ackDropper struct {
	out     []byte
	frames  frameCursor
	dropped bool
}

// feed passes b through the dropper into out.
func (d *ackDropper) feed(b []byte) {
	for len(b) > 0 && !d.dropped {
		inPayload := d.frames.left > 0
		n, header := d.frames.step(b)
		if inPayload {
			d.out = append(d.out, b[:n]...)
		}
		b = b[n:]
		if !header {
			continue // payload passed, or a header not yet whole
		}
		h := d.frames.hdr
		if h[3] == h2FrameSettings && h[4]&h2FlagAck != 0 && d.frames.left == 0 {
			d.dropped = true
			continue
		}
		d.out = append(d.out, h[:]...)
	}
	d.out = append(d.out, b...)
}
