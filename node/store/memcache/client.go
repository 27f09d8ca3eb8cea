package memcache

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// This file is the client of memcached's text protocol: the few commands
// the store sends (incr, decr, add, get, delete, version), one at a time
// on a connection, over a small pool of idle connections per server.

// errReply is a reply the store did not expect: ERROR, CLIENT_ERROR,
// SERVER_ERROR or garbage. The connection is closed after one.
var errReply = errors.New("memcached replied")

// client spreads keys over servers and sends their commands.
type client struct {
	// servers are the servers in order; an SRV refresh replaces them.
	servers atomic.Pointer[[]*server]
}

// server is one memcached and its idle connections.
type server struct {
	addr string
	idle chan *conn  // buffered MaxIdleConns
	tls  *tls.Config // nil: cleartext
}

// conn is one connection, used by one call at a time.
type conn struct {
	nc net.Conn
	r  *bufio.Reader
}

func newClient(c Config, addrs []string) *client {
	cl := &client{}
	cl.setServers(addrs, c)
	return cl
}

// setServers makes addrs the servers, unless they already are; the
// servers replaced close their idle connections.
func (c *client) setServers(addrs []string, cfg Config) {
	if old := c.servers.Load(); old != nil && slices.EqualFunc(*old, addrs, func(s *server, a string) bool { return s.addr == a }) {
		return
	}
	servers := make([]*server, len(addrs))
	for i, a := range addrs {
		servers[i] = &server{addr: a, idle: make(chan *conn, cfg.MaxIdleConns), tls: cfg.TLS}
	}
	if old := c.servers.Swap(&servers); old != nil {
		for _, s := range *old {
			s.drain()
		}
	}
}

// list is the servers now.
func (c *client) list() []*server { return *c.servers.Load() }

// pick is the server that holds key: the CRC-32 (IEEE) of the key modulo
// the number of servers, as gomemcache's ServerList picks it.
func (c *client) pick(key string) *server {
	servers := c.list()
	if len(servers) == 1 {
		return servers[0]
	}
	return servers[crc32.ChecksumIEEE([]byte(key))%uint32(len(servers))]
}

// close closes every idle connection; calls still running close theirs.
func (c *client) close() {
	for _, s := range c.list() {
		s.drain()
	}
}

// drain closes s's idle connections.
func (s *server) drain() {
	for {
		select {
		case cn := <-s.idle:
			cn.nc.Close()
		default:
			return
		}
	}
}

// call sends cmd (and data, when not nil, as a storage command's data
// block) to s and returns the reply's first line, and a get's value, if
// any. It takes an idle connection or dials one, within ctx's deadline.
// A connection that failed, or replied what the store did not expect, is
// closed rather than kept.
func (s *server) call(ctx context.Context, cmd string, data []byte) (line string, value []byte, err error) {
	cn, err := s.take(ctx)
	if err != nil {
		return "", nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		_ = cn.nc.SetDeadline(d)
	} else {
		_ = cn.nc.SetDeadline(time.Time{})
	}
	line, value, err = cn.roundTrip(cmd, data)
	if err != nil {
		cn.nc.Close()
		return "", nil, err
	}
	select {
	case s.idle <- cn:
	default:
		cn.nc.Close()
	}
	return line, value, nil
}

func (s *server) take(ctx context.Context) (*conn, error) {
	select {
	case cn := <-s.idle:
		return cn, nil
	default:
	}
	var nc net.Conn
	var err error
	if s.tls != nil {
		// tls.Dialer takes the server name from the address when the
		// config names none.
		d := tls.Dialer{Config: s.tls}
		nc, err = d.DialContext(ctx, "tcp", s.addr)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", s.addr)
	}
	if err != nil {
		return nil, err
	}
	return &conn{nc: nc, r: bufio.NewReaderSize(nc, 512)}, nil
}

// roundTrip writes one command and reads its reply.
func (cn *conn) roundTrip(cmd string, data []byte) (string, []byte, error) {
	msg := make([]byte, 0, len(cmd)+len(data)+4)
	msg = append(append(msg, cmd...), "\r\n"...)
	if data != nil {
		msg = append(append(msg, data...), "\r\n"...)
	}
	if _, err := cn.nc.Write(msg); err != nil {
		return "", nil, err
	}
	line, err := cn.line()
	if err != nil {
		return "", nil, err
	}
	if !strings.HasPrefix(line, "VALUE ") {
		if line == "ERROR" || strings.HasPrefix(line, "CLIENT_ERROR") || strings.HasPrefix(line, "SERVER_ERROR") {
			return "", nil, fmt.Errorf("%w %q to %q", errReply, line, cmd)
		}
		return line, nil, nil
	}
	// VALUE <key> <flags> <bytes>, the data block, then END.
	f := strings.Fields(line)
	n, err := strconv.Atoi(f[len(f)-1])
	if err != nil || n < 0 || n > 1<<20 {
		return "", nil, fmt.Errorf("%w %q to %q", errReply, line, cmd)
	}
	value := make([]byte, n+2)
	if _, err := io.ReadFull(cn.r, value); err != nil {
		return "", nil, err
	}
	if end, err := cn.line(); err != nil || end != "END" {
		return "", nil, fmt.Errorf("%w %q after a value to %q", errReply, end, cmd)
	}
	return line, value[:n], nil
}

// line reads one line of reply without its CRLF.
func (cn *conn) line() (string, error) {
	l, err := cn.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(l, "\r\n"), nil
}

// counter reads a counter's decimal value as incr, decr and get reply it.
func counter(line string, cmd string) (int64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(line), 10, 63)
	if err != nil {
		return 0, fmt.Errorf("%w %q to %q, not a count", errReply, line, cmd)
	}
	return int64(n), nil
}

// incr adds delta to key's counter (decr takes it away, never below 0) and
// returns the new value; found is false when key holds nothing.
func (c *client) incr(ctx context.Context, op, key string, delta int64) (value int64, found bool, err error) {
	cmd := op + " " + key + " " + strconv.FormatInt(delta, 10)
	line, _, err := c.pick(key).call(ctx, cmd, nil)
	if err != nil {
		return 0, false, err
	}
	if line == "NOT_FOUND" {
		return 0, false, nil
	}
	n, err := counter(line, cmd)
	return n, err == nil, err
}

// add stores value under key for exptime (memcached's: seconds from now up
// to 30 days, else a Unix time) unless key holds something; stored is
// false when it did.
func (c *client) add(ctx context.Context, key string, value, exptime int64) (stored bool, err error) {
	data := strconv.FormatInt(value, 10)
	cmd := "add " + key + " 0 " + strconv.FormatInt(exptime, 10) + " " + strconv.Itoa(len(data))
	line, _, err := c.pick(key).call(ctx, cmd, []byte(data))
	if err != nil {
		return false, err
	}
	switch line {
	case "STORED":
		return true, nil
	case "NOT_STORED":
		return false, nil
	}
	return false, fmt.Errorf("%w %q to %q", errReply, line, cmd)
}

// get returns key's counter; found is false when key holds nothing.
func (c *client) get(ctx context.Context, key string) (value int64, found bool, err error) {
	cmd := "get " + key
	line, data, err := c.pick(key).call(ctx, cmd, nil)
	if err != nil || line == "END" {
		return 0, false, err
	}
	n, err := counter(string(data), cmd)
	return n, err == nil, err
}

// del deletes key; it is not an error that key holds nothing.
func (c *client) del(ctx context.Context, key string) error {
	cmd := "delete " + key
	line, _, err := c.pick(key).call(ctx, cmd, nil)
	if err != nil {
		return err
	}
	if line != "DELETED" && line != "NOT_FOUND" {
		return fmt.Errorf("%w %q to %q", errReply, line, cmd)
	}
	return nil
}

// version asks every server for its version: nil when all answer.
func (c *client) version(ctx context.Context) error {
	for _, s := range c.list() {
		line, _, err := s.call(ctx, "version", nil)
		if err != nil {
			return fmt.Errorf("%s: %w", s.addr, err)
		}
		if !strings.HasPrefix(line, "VERSION ") {
			return fmt.Errorf("%s: %w %q to version", s.addr, errReply, line)
		}
	}
	return nil
}
