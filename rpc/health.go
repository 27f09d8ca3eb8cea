package rpc

import (
	"net/http"

	"connectrpc.com/grpchealth"

	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// health is what the server reports about itself, over gRPC health
// (grpc.health.v1.Health, for load balancers and Kubernetes gRPC probes)
// and as GET /healthz. It covers the whole server ("") and
// quotad.v1.QuotaService, which share one status. It starts SERVING; it
// exists as a type so that later work (draining on shutdown, a store
// outage) can flip it with setServing. Safe for concurrent use.
//
// Embedding grpchealth.StaticChecker makes it a grpchealth.Watcher too, so
// the streaming Watch RPC works and sees every flip.
type health struct {
	*grpchealth.StaticChecker
}

func newHealth() *health {
	return &health{StaticChecker: grpchealth.NewStaticChecker("", quotadv1connect.QuotaServiceName)}
}

// setServing reports every service as SERVING (true) or NOT_SERVING.
func (h *health) setServing(serving bool) {
	status := grpchealth.StatusNotServing
	if serving {
		status = grpchealth.StatusServing
	}
	for _, service := range []string{"", quotadv1connect.QuotaServiceName} {
		h.SetStatus(service, status)
	}
}

// healthz serves GET /healthz for plain HTTP probes: 200 "ok\n" while the
// server is SERVING, 503 "not serving\n" otherwise.
func (h *health) healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	res, err := h.Check(r.Context(), &grpchealth.CheckRequest{})
	if err != nil || res.Status != grpchealth.StatusServing {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not serving\n"))
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}
