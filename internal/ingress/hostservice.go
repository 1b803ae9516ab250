package ingress

import (
	"cmp"
	"maps"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// Protocol is a port's protocol, TCP when unset.
func Protocol(p guestnetv1.IngressPort) corev1.Protocol {
	return cmp.Or(p.Protocol, corev1.ProtocolTCP)
}

// HostService is the host LoadBalancer Service of gi, as guestnet server-side applies it in
// gi's namespace: it selects the virt-launcher pods of the Cluster's worker VMs and forwards
// each port to the guest nodePort behind it (nodePorts: port name -> guest nodePort; every
// spec port must have one). Everything on it is owned by guestnet's field manager, so a
// label or annotation the user removes from spec.loadBalancer is removed from the Service on
// the next apply. gi must have its UID (it is the Service's controller: the garbage
// collector deletes the Service with it).
func HostService(gi *guestnetv1.GuestIngress, nodePorts map[string]int32) *corev1ac.ServiceApplyConfiguration {
	lb := gi.Spec.LoadBalancer

	svcLabels := maps.Clone(lb.Labels)
	if svcLabels == nil {
		svcLabels = map[string]string{}
	}
	maps.Copy(svcLabels, hostnames.Labels(gi))

	annotations := maps.Clone(lb.Annotations)
	if lb.IP != "" {
		if annotations == nil {
			annotations = map[string]string{}
		}
		annotations[LBIPAMIPsAnnotation] = lb.IP
	}

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

	svc := corev1ac.Service(hostnames.HostService(gi), gi.Namespace).
		WithLabels(svcLabels).
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(guestnetv1.GroupVersion.String()).
			WithKind("GuestIngress").
			WithName(gi.Name).
			WithUID(gi.UID).
			WithController(true).
			WithBlockOwnerDeletion(true)).
		WithSpec(corev1ac.ServiceSpec().
			WithType(corev1.ServiceTypeLoadBalancer).
			WithSelector(virtlauncher.WorkerSelector(gi.Spec.ClusterName)).
			WithPorts(ports...).
			WithLoadBalancerClass(LoadBalancerClass(gi)).
			WithExternalTrafficPolicy(etp))
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
