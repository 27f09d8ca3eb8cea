package rpc

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// This file asks one member for its GET /status, for the cluster view
// (status_cluster.go): where its API is, the request within its bounds,
// and what its answer must be.

// Bounds of the fan-out.
const (
	// memberStatusTimeout bounds one member's answer: a member that takes
	// longer is shown as not answering, with the timeout.
	memberStatusTimeout = 2 * time.Second
	// memberStatusConcurrency bounds the members asked at once.
	memberStatusConcurrency = 8
	// maxMemberStatusBytes bounds one member's answer; a member's page is
	// a few KiB per policy.
	maxMemberStatusBytes = 4 << 20
)

// MembersConfig says how a node reaches the other members' GET /status
// for GET /status?scope=cluster. The zero value asks each member over
// plain HTTP on the port of Config.Listen.
type MembersConfig struct {
	// APIPort is the port of every member's API, joined to the host of the
	// gossip address the member advertises to the cluster. 0 means the
	// port of Config.Listen: every member listens on the same port.
	APIPort int
	// TLS, when not nil, makes the requests HTTPS with these settings:
	// the roots the members' certificates are verified against (for the
	// member's gossip host, usually an IP address) and the certificate to
	// present to members that require one. nil asks over plain HTTP.
	TLS *tls.Config
}

// memberAsker asks members for their GET /status. Safe for concurrent
// use.
type memberAsker struct {
	client *http.Client
	scheme string
	// port is the members' API port; empty when it is unknown (Listen
	// with port 0 and no APIPort).
	port string
}

func newMemberAsker(cfg MembersConfig, listen string) *memberAsker {
	port := ""
	if cfg.APIPort != 0 {
		port = strconv.Itoa(cfg.APIPort)
	} else if _, p, err := net.SplitHostPort(listen); err == nil && p != "0" {
		port = p
	} else if listen == "" {
		port = "8080"
	}
	tr := &http.Transport{
		Proxy:               nil, // members are reached directly, never through HTTP_PROXY
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     time.Minute,
		ForceAttemptHTTP2:   true,
		TLSClientConfig:     cfg.TLS,
	}
	scheme := "http"
	if cfg.TLS != nil {
		scheme = "https"
	}
	return &memberAsker{client: &http.Client{Transport: tr}, scheme: scheme, port: port}
}

// baseURL is the member's API URL: its gossip host and the API port.
func (a *memberAsker) baseURL(gossipAddr string) (string, error) {
	host, _, err := net.SplitHostPort(gossipAddr)
	if err != nil {
		return "", fmt.Errorf("not asked: its gossip address %q has no host to reach its API at", gossipAddr)
	}
	if a.port == "" {
		return "", errors.New("not asked: the members' API port is unknown (this node listens on port 0); set --cluster-api-port")
	}
	return a.scheme + "://" + net.JoinHostPort(host, a.port), nil
}

// ask reads one member's GET /status at base. The member must answer as
// name: another name means the API port points at another node.
func (a *memberAsker) ask(ctx context.Context, base, name string, history bool) (*statusJSON, error) {
	ctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
	defer cancel()
	u := base + "/status"
	if history {
		u += "?history=1"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	res, err := a.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("GET %s: no answer within %s", u, memberStatusTimeout)
		}
		// url.Error repeats the method and URL this message starts with.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		var dial *net.OpError
		if errors.As(err, &dial) && dial.Op == "dial" {
			return nil, fmt.Errorf("GET %s: %w (the member's API is asked at its gossip host and --cluster-api-port, default the port of --listen)", u, err)
		}
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxMemberStatusBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading the answer: %w", u, err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", u, res.Status, strings.TrimSpace(string(body[:min(len(body), 300)])))
	}
	if len(body) > maxMemberStatusBytes {
		return nil, fmt.Errorf("GET %s: the answer is over %d bytes", u, maxMemberStatusBytes)
	}
	var page statusJSON
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, fmt.Errorf("GET %s: not a quotad status page: %w", u, err)
	}
	if page.Node != name {
		return nil, fmt.Errorf("GET %s: answered as %q, not %q: the members' API port (--cluster-api-port) reaches another node", u, page.Node, name)
	}
	return &page, nil
}
