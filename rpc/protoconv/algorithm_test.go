package protoconv

import (
	"strings"
	"testing"

	"github.com/quotad/quotad/algorithms"
	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// Every enum value but UNSPECIFIED maps to an algorithm and back, and
// every algorithm the API has a value for maps to it and back.
func TestAlgorithmRoundTrip(t *testing.T) {
	for n, name := range quotadv1.Algorithm_name {
		pa := quotadv1.Algorithm(n)
		a, ok := AlgorithmFromProto(pa)
		if pa == quotadv1.Algorithm_ALGORITHM_UNSPECIFIED {
			if ok {
				t.Errorf("UNSPECIFIED maps to %v", a)
			}
			continue
		}
		if !ok {
			t.Errorf("%s maps to no algorithm", name)
			continue
		}
		if name != "ALGORITHM_"+strings.ToUpper(a.String()) {
			t.Errorf("%s maps to %v", name, a)
		}
		if back := AlgorithmToProto(a); back != pa {
			t.Errorf("%v maps back to %v, not %s", a, back, name)
		}
	}
	if got := AlgorithmToProto(algorithms.Algorithm(-1)); got != quotadv1.Algorithm_ALGORITHM_UNSPECIFIED {
		t.Errorf("an invalid algorithm maps to %v", got)
	}
	if _, ok := AlgorithmFromProto(quotadv1.Algorithm(1 << 20)); ok {
		t.Error("an unknown enum number maps to an algorithm")
	}
}
