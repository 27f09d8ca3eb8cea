package guard

import (
	"context"
	"crypto/tls"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// This file lets grpc-go's calls keep the connection cap's idle list
// (conn_limit.go): its transport credentials hand each call its
// connection, and its interceptors mark the connection busy.

// ConnCredentials are the gRPC front end's transport credentials, for
// grpc.Creds on a grpc.Server that serves a LimitListener's connections
// (directly or through a SplitListener): no handshake and no I/O (TLS, if
// any, ended below), only an AuthInfo that carries the connection's
// ServerConn, for its calls to keep the connection cap's idle list (see
// CallConn), and its TLS state, for a call to see who its client is
// (peer.FromContext), as grpc-go's own TLS credentials give. The zero
// value is the credentials; safe for concurrent use.
type ConnCredentials struct{}

var _ credentials.TransportCredentials = ConnCredentials{}

// connInfo is ConnCredentials' AuthInfo.
type connInfo struct {
	credentials.TLSInfo // zero without TLS
	conn                *ServerConn
}

// AuthType implements credentials.AuthInfo.
func (i connInfo) AuthType() string {
	if i.State.Version == 0 {
		return "insecure"
	}
	return i.TLSInfo.AuthType()
}

// ServerHandshake implements credentials.TransportCredentials.
func (ConnCredentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := connInfo{conn: asServerConn(c)}
	info.SecurityLevel = credentials.NoSecurity
	for nc := c; nc != nil; {
		if tc, ok := nc.(*tls.Conn); ok {
			info.State = tc.ConnectionState()
			info.SecurityLevel = credentials.PrivacyAndIntegrity
			break
		}
		u, ok := nc.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		nc = u.NetConn()
	}
	return c, info, nil
}

// ClientHandshake implements credentials.TransportCredentials; the server
// never calls it.
func (ConnCredentials) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, connInfo{}, nil
}

// Info implements credentials.TransportCredentials.
func (ConnCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "quotad"}
}

// Clone implements credentials.TransportCredentials.
func (ConnCredentials) Clone() credentials.TransportCredentials { return ConnCredentials{} }

// OverrideServerName implements credentials.TransportCredentials.
func (ConnCredentials) OverrideServerName(string) error { return nil }

// CallConn returns the ServerConn a gRPC call came on, from the call's
// context; nil if the call did not come through ConnCredentials (nil's
// Begin and End do nothing).
func CallConn(ctx context.Context) *ServerConn {
	if p, ok := peer.FromContext(ctx); ok {
		if i, ok := p.AuthInfo.(connInfo); ok {
			return i.conn
		}
	}
	return nil
}

// CallsInterceptor is a grpc.UnaryServerInterceptor that keeps a unary
// call's connection busy (ServerConn.Begin, End) while it runs, for the
// gRPC services the front end does not write itself (health).
func CallsInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	c := CallConn(ctx)
	c.Begin()
	defer c.End()
	return next(ctx, req)
}

// StreamsInterceptor is a grpc.StreamServerInterceptor that keeps a
// stream's connection busy while it is open (a health Watch, reflection).
func StreamsInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	c := CallConn(ss.Context())
	c.Begin()
	defer c.End()
	return next(srv, ss)
}
