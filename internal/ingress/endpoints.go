package ingress

import (
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// CountEndpoints counts the endpoints (worker virt-launcher pods) in a Service's
// EndpointSlices: how many there are and how many are ready. An endpoint whose ready
// condition is unset counts as ready, as EndpointSlice consumers must read it. Each pod is
// counted once even when it appears in several slices (e.g. one per address family).
func CountEndpoints(slices []discoveryv1.EndpointSlice) (ready, total int32) {
	seen := map[string]bool{}
	for _, s := range slices {
		for _, e := range s.Endpoints {
			key := endpointKey(e)
			if key == "" || seen[key] {
				continue
			}
			seen[key] = true
			total++
			if ptr.Deref(e.Conditions.Ready, true) {
				ready++
			}
		}
	}
	return ready, total
}

func endpointKey(e discoveryv1.Endpoint) string {
	if e.TargetRef != nil && e.TargetRef.UID != "" {
		return string(e.TargetRef.UID)
	}
	if len(e.Addresses) > 0 {
		return e.Addresses[0]
	}
	return ""
}
