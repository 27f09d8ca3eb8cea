package redis

import (
	"net"
	"strconv"

	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// dbAttributes describes the store in OpenTelemetry's database terms, for
// the spans of its calls: db.system.name, and for a single server its
// address, port and database index (db.namespace).
func (s *Store) DBAttributes() []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.DBSystemNameRedis}
	c, ok := s.client.(*goredis.Client)
	if !ok {
		return attrs
	}
	opts := c.Options()
	attrs = append(attrs, semconv.DBNamespace(strconv.Itoa(opts.DB)))
	if host, port, err := net.SplitHostPort(opts.Addr); err == nil {
		attrs = append(attrs, semconv.ServerAddress(host))
		if p, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, semconv.ServerPort(p))
		}
	}
	return attrs
}
