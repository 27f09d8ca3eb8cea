package rpc

import (
	"net/http"
	"sync"

	"connectrpc.com/grpchealth"

	"github.com/quotad/quotad/node"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// Health is whether the server should receive traffic (readiness), reported
// over gRPC health (grpc.health.v1.Health, for load balancers and
// Kubernetes gRPC probes) and as GET /readyz; GET /healthz is liveness and
// answers 200 while the process serves HTTP at all.
//
// The server is NOT_SERVING while it drains for shutdown (Drain), and while
// the store is unavailable (the node's circuit breaker is open) if the
// node's default failure mode is closed: such a node can only deny, and
// another may still reach the store. With the default mode open it keeps
// serving, marked fail-open, rather than take the API down. Both "" and
// quotad.v1.QuotaService share the status.
//
// Embedding grpchealth.StaticChecker makes it a grpchealth.Watcher too, so
// the streaming Watch RPC sees every change. Safe for concurrent use.
type Health struct {
	*grpchealth.StaticChecker
	node *node.Node

	mu       sync.Mutex
	draining bool
}

// NewHealth returns n's health, SERVING unless n's store is already
// unavailable and failing closed. It follows n's store availability from
// now on.
func NewHealth(n *node.Node) *Health {
	h := &Health{StaticChecker: grpchealth.NewStaticChecker("", quotadv1connect.QuotaServiceName), node: n}
	n.OnStoreAvailability(func(bool) { h.update() })
	h.update()
	return h
}

// Drain reports NOT_SERVING from now on, so that load balancers stop
// sending requests before the server stops accepting them.
func (h *Health) Drain() {
	h.mu.Lock()
	h.draining = true
	h.mu.Unlock()
	h.update()
}

// notReady says why the server should not receive traffic, or "".
func (h *Health) notReady() string {
	h.mu.Lock()
	draining := h.draining
	h.mu.Unlock()
	switch {
	case draining:
		return "draining for shutdown"
	case !h.node.StoreAvailable() && h.node.DefaultFailureMode() == node.FailClosed:
		return "store unavailable and failing closed"
	}
	return ""
}

// update sets every service's status from the current state. The mutex
// orders concurrent updates, so the last state wins.
func (h *Health) update() {
	h.mu.Lock()
	defer h.mu.Unlock()
	status := grpchealth.StatusServing
	if h.draining || !h.node.StoreAvailable() && h.node.DefaultFailureMode() == node.FailClosed {
		status = grpchealth.StatusNotServing
	}
	for _, service := range []string{"", quotadv1connect.QuotaServiceName} {
		h.SetStatus(service, status)
	}
}

// healthz serves GET /healthz, liveness: 200 "ok\n" while the process
// answers HTTP at all. A store outage or a drain is not a reason to
// restart the process.
func (h *Health) healthz(w http.ResponseWriter, _ *http.Request) {
	plain(w)
	_, _ = w.Write([]byte("ok\n"))
}

// readyz serves GET /readyz, readiness: 200 "ready\n", or 503 with the
// reason, as gRPC health reports.
func (h *Health) readyz(w http.ResponseWriter, _ *http.Request) {
	plain(w)
	if why := h.notReady(); why != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: " + why + "\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

func plain(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
}
