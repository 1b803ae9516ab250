package ingress

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// Protocol is a port's protocol, TCP when unset.
func Protocol(p guestnetv1.IngressPort) corev1.Protocol {
	return cmp.Or(p.Protocol, corev1.ProtocolTCP)
}

// ForbiddenHostServiceKey reports whether a label or annotation key may never reach a host
// Service from spec.loadBalancer, whatever a GuestIngressPolicy says (the API server also
// rejects policies that allow it): guestnet's own marks, Cilium LB-IPAM's and MetalLB's IP
// requests and sharing keys, service.kubernetes.io/service-proxy-name, and Cilium's
// io.kubernetes.service.* pseudo-labels.
func ForbiddenHostServiceKey(key string) bool {
	return slices.Contains(guestnetv1.ForbiddenHostServiceKeys, key) ||
		slices.ContainsFunc(guestnetv1.ForbiddenHostServiceKeyPrefixes, func(p string) bool { return strings.HasPrefix(key, p) })
}

// withoutForbiddenKeys copies m without the keys ForbiddenHostServiceKey refuses.
func withoutForbiddenKeys(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if !ForbiddenHostServiceKey(k) {
			out[k] = v
		}
	}
	return out
}

// HostServiceLabels are the labels of gi's host Service: spec.loadBalancer.labels without
// the forbidden keys, and guestnet's own, which win. Pools and L2 policies match these (with
// Cilium's pseudo-labels), so admission judges pools against exactly this set.
func HostServiceLabels(gi *guestnetv1.GuestIngress) map[string]string {
	svcLabels := withoutForbiddenKeys(gi.Spec.LoadBalancer.Labels)
	maps.Copy(svcLabels, ownership.Labels(gi))
	return svcLabels
}

// HostServiceAnnotations are the annotations of gi's host Service: spec.loadBalancer.annotations
// without the forbidden keys, the announcer's IP request for the fixed IPs (Cilium LB-IPAM's
// lbipam.cilium.io/ips, or MetalLB's metallb.io/loadBalancerIPs with metallb.io/address-pool
// naming guestnet's pool, so that no other pool hands it an address), and the mark of the
// manager instance that made it (ownership.WatchFilterAnnotation).
func HostServiceAnnotations(gi *guestnetv1.GuestIngress, a Announcer) map[string]string {
	annotations := withoutForbiddenKeys(gi.Spec.LoadBalancer.Annotations)
	ips := strings.Join(RequestedIPs(gi), ",")
	switch {
	case a == AnnouncerMetalLB:
		annotations[MetalLBAddressPoolAnnotation] = hostnames.Pool(gi)
		if ips != "" {
			annotations[MetalLBLoadBalancerIPsAnnotation] = ips
		}
	case ips != "":
		annotations[LBIPAMIPsAnnotation] = ips
	}
	if mark := ownership.InstanceMark(gi); mark != "" {
		annotations[ownership.WatchFilterAnnotation] = mark
	}
	return annotations
}

// HostService is the host LoadBalancer Service of gi, as guestnet server-side applies it in
// gi's namespace: it selects the virt-launcher pods of the Cluster's worker VMs and forwards
// each port to the guest nodePort behind it (nodePorts: port name -> guest nodePort; every
// spec port must have one). It opens no nodePort on the host nodes
// (allocateLoadBalancerNodePorts: false; only externalTrafficPolicy Local, where a policy
// admits it, makes the host allocate a health-check nodePort). Everything on it is owned by
// guestnet's field manager, so a label or annotation the user removes from spec.loadBalancer
// is removed from the Service on the next apply. gi must have its UID (it is the Service's
// controller: the garbage collector deletes the Service with it).
func HostService(gi *guestnetv1.GuestIngress, nodePorts map[string]int32, a Admission) *corev1ac.ServiceApplyConfiguration {
	lb := gi.Spec.LoadBalancer
	annotations := HostServiceAnnotations(gi, a.Announcer)

	ports := make([]*corev1ac.ServicePortApplyConfiguration, 0, len(gi.Spec.Ports))
	for _, p := range gi.Spec.Ports {
		ports = append(ports, corev1ac.ServicePort().
			WithName(p.Name).
			WithPort(p.Port).
			WithProtocol(Protocol(p)).
			WithTargetPort(intstr.FromInt32(nodePorts[p.Name])))
	}

	etp := lb.ExternalTrafficPolicy
	if etp == "" {
		etp = corev1.ServiceExternalTrafficPolicyCluster
	}

	families := IPFamilies(gi)
	spec := corev1ac.ServiceSpec().
		WithType(corev1.ServiceTypeLoadBalancer).
		WithPorts(ports...).
		WithLoadBalancerClass(LoadBalancerClass(gi)).
		WithAllocateLoadBalancerNodePorts(false).
		WithExternalTrafficPolicy(etp).
		WithIPFamilyPolicy(IPFamilyPolicy(families)).
		WithIPFamilies(families...)
	if !Local(gi) {
		// With Local, guestnet writes the endpoints itself (HostEndpointSlices).
		spec.WithSelector(virtlauncher.WorkerSelector(gi.Namespace, gi.Spec.ClusterName))
	}
	svc := corev1ac.Service(hostnames.HostService(gi), gi.Namespace).
		WithLabels(HostServiceLabels(gi)).
		WithOwnerReferences(controllerRef(gi)).
		WithSpec(spec)
	if len(annotations) > 0 {
		svc.WithAnnotations(annotations)
	}
	return svc
}

// LoadBalancerIP is the first IP in the Service's status.loadBalancer.ingress, "" when none.
func LoadBalancerIP(svc *corev1.Service) string {
	if svc == nil {
		return ""
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if in.IP != "" {
			return in.IP
		}
	}
	return ""
}
