//lint:file-ignore SA1019 these helpers speak grpc.reflection.v1alpha on purpose: older clients (grpcurl among them) still do, and quotad serves it.

package quotadtest

import (
	"slices"
	"testing"

	"google.golang.org/grpc"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
)

// ReflectedServices asks the gRPC server behind conn, through server
// reflection v1 and v1alpha, which services it lists and for the file that
// declares symbol. It fails t unless both versions list the same services
// and describe symbol's file, and returns the list, sorted.
func ReflectedServices(t testing.TB, conn grpc.ClientConnInterface, symbol string) []string {
	t.Helper()
	v1, err := reflectionv1.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := v1.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	res, err := v1.Recv()
	if err != nil {
		t.Fatal(err)
	}
	got := sortedNames(res.GetListServicesResponse().GetService())
	if err := v1.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}); err != nil {
		t.Fatal(err)
	}
	if res, err := v1.Recv(); err != nil || len(res.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Errorf("reflection v1 FileContainingSymbol %s: %v, %v", symbol, res, err)
	}

	v1alpha, err := reflectionv1alpha.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := v1alpha.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resAlpha, err := v1alpha.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if alpha := sortedNames(resAlpha.GetListServicesResponse().GetService()); !slices.Equal(alpha, got) {
		t.Errorf("reflection v1alpha lists %v, v1 %v", alpha, got)
	}
	if err := v1alpha.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}}); err != nil {
		t.Fatal(err)
	}
	if res, err := v1alpha.Recv(); err != nil || len(res.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Errorf("reflection v1alpha FileContainingSymbol %s: %v, %v", symbol, res, err)
	}
	return got
}

// sortedNames are the names of a reflection ListServices answer, sorted.
func sortedNames[S interface{ GetName() string }](services []S) []string {
	names := make([]string, 0, len(services))
	for _, s := range services {
		names = append(names, s.GetName())
	}
	slices.Sort(names)
	return names
}
