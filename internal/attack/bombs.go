package attack

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Bombs posts a gzip decompression bomb every Every as a CheckBatch, the
// call whose messages may be largest, alternating between two paths: JSON
// over HTTP/1.1 (Content-Encoding gzip), and gRPC on cleartext HTTP/2
// (grpc-encoding gzip). Each goes on a connection of its own. A server that stops inflating at its limit
// answers ResourceExhausted (HTTP 429, grpc-status 8); one whose body is
// too slow to arrive, DeadlineExceeded (its read timeout). One bomb at a
// time. Set the fields before Run; Stats may be read at any time.
type Bombs struct {
	// URL is the server's base URL (http://host:port).
	URL string
	// Body is the gzip body (GzipBomb's); with gRPC's 5-byte prefix it
	// must fit the server's request limit, or it is refused unread.
	Body  []byte
	Every time.Duration

	sent, refused, timedOut, other atomic.Int64
	mu                             sync.Mutex
	lastOther                      string
}

// BombStats counts a Bombs's requests.
type BombStats struct {
	// Sent counts bombs posted; Refused those answered ResourceExhausted,
	// TimedOut those cut by the server's read timeout (DeadlineExceeded);
	// Other anything else (LastOther says what, last).
	Sent, Refused, TimedOut, Other int64
	LastOther                      string
}

// Stats returns the counts so far.
func (a *Bombs) Stats() BombStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return BombStats{Sent: a.sent.Load(), Refused: a.refused.Load(), TimedOut: a.timedOut.Load(), Other: a.other.Load(), LastOther: a.lastOther}
}

// Run bombs until ctx ends.
func (a *Bombs) Run(ctx context.Context) {
	t := time.NewTicker(orDefault(a.Every, time.Second))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil { // a tick and the end at once: the end wins
			return
		}
		var out outcome
		var err error
		if i%2 == 0 {
			out, err = a.json()
		} else {
			out, err = a.grpc()
		}
		a.sent.Add(1)
		switch {
		case err != nil:
			a.other.Add(1)
			a.mu.Lock()
			a.lastOther = err.Error()
			a.mu.Unlock()
		case out == timedOut:
			a.timedOut.Add(1)
		default:
			a.refused.Add(1)
		}
	}
}

// outcome is how the server refused a bomb.
type outcome int

const (
	tooLarge outcome = iota
	timedOut
)

// json posts the bomb as a JSON CheckBatch and reports an error unless it is
// refused, as too large or too slow.
func (a *Bombs) json() (outcome, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, a.URL+"/quotad.v1.QuotaService/CheckBatch", bytes.NewReader(a.Body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("json: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	switch {
	case resp.StatusCode == http.StatusTooManyRequests && strings.Contains(string(raw), "resource_exhausted"):
		return tooLarge, nil
	case resp.StatusCode == http.StatusGatewayTimeout && strings.Contains(string(raw), "deadline_exceeded"):
		return timedOut, nil
	}
	return 0, fmt.Errorf("json: %s %.200s", resp.Status, raw)
}

// grpc posts the bomb as one compressed gRPC message and reports an error
// unless it is refused, with grpc-status 8 (too large) or 4 (too slow).
func (a *Bombs) grpc() (outcome, error) {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	body := append(binary.BigEndian.AppendUint32([]byte{1}, uint32(len(a.Body))), a.Body...)
	req, err := http.NewRequest(http.MethodPost, a.URL+"/quotad.v1.QuotaService/CheckBatch", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Grpc-Encoding", "gzip")
	req.Header.Set("Te", "trailers")
	resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("grpc: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	// In the trailers, or in the headers of a trailers-only response.
	switch status := resp.Trailer.Get("Grpc-Status") + resp.Header.Get("Grpc-Status"); status {
	case "8":
		return tooLarge, nil
	case "4":
		return timedOut, nil
	default:
		return 0, fmt.Errorf("grpc: grpc-status %q: %s", status, resp.Trailer.Get("Grpc-Message")+resp.Header.Get("Grpc-Message"))
	}
}
