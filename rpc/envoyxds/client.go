// Package envoyxds takes Envoy rate limit rules from an xDS management
// server, as envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW: it
// holds one aggregated discovery stream (state of the world) asking for
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig, hands
// every response's resources, each as the text of an envoyproxy/ratelimit
// config file, to its caller, and acknowledges the response if the caller
// applied them, or refuses it (NACK) if not, so that the rules in force stay
// the last good ones. When the stream breaks it dials again after a wait,
// keeping the rules it had.
package envoyxds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	corev3 "github.com/quotad/quotad/proto/envoy/config/core/v3"
	discoveryv3 "github.com/quotad/quotad/proto/envoy/service/discovery/v3"
	ratelimitconfv3 "github.com/quotad/quotad/proto/ratelimit/config/ratelimit/v3"
)

// TypeURL is the resource type the client asks for.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// streamMethod is the aggregated discovery stream's method path.
const streamMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"

// Config says where the management server is and who the client is.
type Config struct {
	// Server is the management server's host:port.
	Server string
	// NodeID names this client (Node.id); management servers keep a
	// snapshot per node id. Required.
	NodeID string
	// NodeMetadata is Node.metadata, as string values.
	NodeMetadata map[string]string
	// Headers are sent with the stream (e.g. an authorization token).
	Headers map[string]string
	// TLS, if not nil, secures the connection; nil dials in cleartext.
	TLS *tls.Config
	// RetryInterval is the wait before dialing again after the stream
	// broke or could not open, with jitter of up to half of it. 0 means
	// 3s, envoyproxy/ratelimit's CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL.
	RetryInterval time.Duration
	// MaxMessageBytes bounds one response; 0 means 4 MiB, the most an
	// envoyproxy/ratelimit rules directory holds in quotad.
	MaxMessageBytes int
}

// File is one resource, as the text of an envoyproxy/ratelimit config
// file: Name is the resource's name prefixed with "xds:", for errors.
type File struct {
	Name string
	Text []byte
}

// Apply puts a response's files in force, replacing all that came before
// (state of the world), or returns why not; the client then refuses the
// response and the previous files stay in force.
type Apply func(version string, files []File) error

// Run holds the stream until ctx ends: it dials cfg.Server, asks for the
// rules, and hands each response to apply. It returns ctx's error.
func Run(ctx context.Context, cfg Config, apply Apply, log *slog.Logger) error {
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = 3 * time.Second
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 4 << 20
	}
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	conn, err := grpc.NewClient(cfg.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.MaxMessageBytes)))
	if err != nil {
		return fmt.Errorf("xds server %s: %w", cfg.Server, err)
	}
	defer conn.Close()
	node, err := nodeOf(cfg)
	if err != nil {
		return err
	}
	c := &client{cfg: cfg, conn: conn, node: node, apply: apply, log: log}
	for {
		err := c.stream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := cfg.RetryInterval + rand.N(cfg.RetryInterval/2+1)
		log.Warn("envoy xds: stream to the management server ended; the rules in force stay, dialing again",
			"server", cfg.Server, "err", err, "after", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

func nodeOf(cfg Config) (*corev3.Node, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("xds: a node id is required (management servers keep their rules per node id)")
	}
	n := &corev3.Node{Id: cfg.NodeID, UserAgentName: "quotad"}
	if len(cfg.NodeMetadata) > 0 {
		m := map[string]any{}
		for k, v := range cfg.NodeMetadata {
			m[k] = v
		}
		s, err := structpb.NewStruct(m)
		if err != nil {
			return nil, fmt.Errorf("xds node metadata: %w", err)
		}
		n.Metadata = s
	}
	return n, nil
}

// client is one Run's state.
type client struct {
	cfg   Config
	conn  *grpc.ClientConn
	node  *corev3.Node
	apply Apply
	log   *slog.Logger
	// accepted is the version of the last response applied, across
	// streams: a new stream says what it has.
	accepted string
}

// stream holds one stream until it breaks or ctx ends.
func (c *client) stream(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.cfg.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.cfg.Headers))
	}
	s, err := c.conn.NewStream(ctx, &grpc.StreamDesc{StreamName: "StreamAggregatedResources", ServerStreams: true, ClientStreams: true}, streamMethod)
	if err != nil {
		return err
	}
	// The first request names the node; later ones need not.
	if err := s.SendMsg(&discoveryv3.DiscoveryRequest{Node: c.node, TypeUrl: TypeURL, VersionInfo: c.accepted}); err != nil {
		return err
	}
	for {
		var res discoveryv3.DiscoveryResponse
		if err := s.RecvMsg(&res); err != nil {
			return err
		}
		if res.GetTypeUrl() != TypeURL {
			c.log.Warn("envoy xds: a response of another type, refused", "type_url", res.GetTypeUrl())
			if err := s.SendMsg(&discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, VersionInfo: c.accepted, ResponseNonce: res.GetNonce()}); err != nil {
				return err
			}
			continue
		}
		files, err := filesOf(&res)
		if err == nil {
			err = c.apply(res.GetVersionInfo(), files)
		}
		if err != nil {
			c.log.Error("envoy xds: rules refused; the rules in force stay", "version", res.GetVersionInfo(), "err", err)
		} else {
			c.accepted = res.GetVersionInfo()
			c.log.Info("envoy xds: rules applied", "version", c.accepted, "resources", len(files))
		}
		// An ACK names the response's version, a NACK the last accepted.
		if err := s.SendMsg(&discoveryv3.DiscoveryRequest{TypeUrl: TypeURL, VersionInfo: c.accepted, ResponseNonce: res.GetNonce()}); err != nil {
			return err
		}
	}
}

// filesOf turns a response's resources into config file texts: each
// RateLimitConfig as protobuf's JSON with the proto field names (a YAML
// document in envoyproxy/ratelimit's format, as that project turns them
// into YAML), without its name, which names the file instead.
func filesOf(res *discoveryv3.DiscoveryResponse) ([]File, error) {
	files := make([]File, 0, len(res.GetResources()))
	for i, a := range res.GetResources() {
		if a.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resource %d is a %s, not a RateLimitConfig", i, a.GetTypeUrl())
		}
		var rc ratelimitconfv3.RateLimitConfig
		if err := a.UnmarshalTo(&rc); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		name := rc.GetName()
		if name == "" {
			name = fmt.Sprintf("resource %d", i)
		}
		rc.Name = ""
		text, err := protojson.MarshalOptions{UseProtoNames: true, Multiline: true}.Marshal(&rc)
		if err != nil {
			return nil, fmt.Errorf("resource %s: %w", name, err)
		}
		files = append(files, File{Name: "xds:" + name, Text: text})
	}
	return files, nil
}
