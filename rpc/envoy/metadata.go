package envoy

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	rlscommonv3 "github.com/quotad/quotad/proto/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/quotad/quotad/proto/envoy/service/ratelimit/v3"
)

// This file is envoyproxy/ratelimit's response dynamic metadata
// (RESPONSE_DYNAMIC_METADATA): what the request asked, and the metadata
// of the rules whose descriptors were within their limits, for Envoy to
// put in the request's dynamic metadata.

// dynamicMetadata is the metadata of an answer to req: its domain, its
// descriptors (each entry as "key=value", with the descriptor's own limit,
// limitText, and hits_addend if it has them), the request's hits_addend if
// set, and under "metadata" the metadata of the rules of the descriptors
// that are not over their limit, unlimited rules' excepted, merged in
// order (a key already set is kept, mappings merge).
func dynamicMetadata(req *rlsv3.RateLimitRequest, checks []check, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	descriptors := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		entries := make([]*structpb.Value, 0, len(d.GetEntries()))
		for _, e := range d.GetEntries() {
			entries = append(entries, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		df := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if l := d.GetLimit(); l != nil {
			df["limit"] = structpb.NewStringValue(limitText(l))
		}
		if h := d.GetHitsAddend(); h != nil {
			df["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descriptors = append(descriptors, structpb.NewStructValue(&structpb.Struct{Fields: df}))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descriptors})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i, c := range checks {
		// As envoyproxy/ratelimit, an unlimited rule's descriptor is not
		// among those that passed.
		if c.rule != nil && !c.rule.unlimited && c.rule.metadata != nil && statuses[i].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			mergeMetadata(passed, c.rule.metadata)
		}
	}
	if len(passed.GetFields()) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata merges src into dest: a key dest lacks is added, two
// mappings under one key merge, and otherwise dest's value stays.
func mergeMetadata(dest, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dest.GetFields()[k]
		switch {
		case !ok:
			// A copy: dest's mappings are merged into later, and src is
			// the rule's own.
			dest.Fields[k] = proto.Clone(v).(*structpb.Value)
		case have.GetStructValue() != nil && v.GetStructValue() != nil:
			mergeMetadata(have.GetStructValue(), v.GetStructValue())
		}
	}
}

// limitText is a descriptor's own limit as envoyproxy/ratelimit writes it
// there (the protobuf's text, with one space between fields where Go's
// String varies the spacing on purpose): "requests_per_unit:5 unit:HOUR".
func limitText(l *rlscommonv3.RateLimitDescriptor_RateLimitOverride) string {
	s := fmt.Sprintf("requests_per_unit:%d unit:%s", l.GetRequestsPerUnit(), l.GetUnit())
	if m := l.GetUnitMultiplier(); m != nil {
		s += fmt.Sprintf(" unit_multiplier:{value:%d}", m.GetValue())
	}
	return s
}
