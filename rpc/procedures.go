package rpc

import (
	"github.com/quotad/quotad/proto/envoy/service/ratelimit/v3/ratelimitv3connect"
	"github.com/quotad/quotad/proto/quotad/v1/quotadv1connect"
)

// This file names the sets of procedures the server treats apart: the
// admin ones, which the admin token guards, and those telemetry observes.

// isAdminProcedure reports whether procedure changes state for every
// client, so that Config.AdminToken guards it.
func isAdminProcedure(procedure string) bool {
	return procedure == quotadv1connect.QuotaServiceResetProcedure
}

// apiProcedures are the unary procedures that telemetry observes.
var apiProcedures = []string{
	quotadv1connect.QuotaServiceCheckProcedure,
	quotadv1connect.QuotaServiceCheckBatchProcedure,
	quotadv1connect.QuotaServiceResetProcedure,
	quotadv1connect.QuotaServiceListPoliciesProcedure,
	quotadv1connect.QuotaServiceRenewSlotProcedure,
	quotadv1connect.QuotaServiceReleaseSlotProcedure,
	quotadv1connect.QuotaServiceAcquireLeaseProcedure,
	quotadv1connect.QuotaServiceReturnLeaseProcedure,
	quotadv1connect.QuotaServiceReserveProcedure,
	quotadv1connect.QuotaServiceSettleProcedure,
	ratelimitv3connect.RateLimitServiceShouldRateLimitProcedure,
}
