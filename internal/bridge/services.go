package bridge

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// The Services the bridge keeps for a backend, as server-side apply configurations. Each
// lists only the fields guestnet owns.

// allocated are the backend's ports that have a nodePort.
func (b *Backend) allocated() []BackendPort {
	var out []BackendPort
	for _, p := range b.Ports {
		if p.NodePort != 0 {
			out = append(out, p)
		}
	}
	return out
}

// Usable reports whether the backend has at least one port with a nodePort.
func (b *Backend) Usable() bool { return len(b.allocated()) > 0 }

// GuestNodePortService is the NodePort Service next to the backend's guest Service: the same
// selector and target ports, the bridge's fixed nodePorts. The chart's Service stays as it is.
func GuestNodePortService(gwb *guestnetv1.GuestWebhookBridge, b *Backend) *corev1ac.ServiceApplyConfiguration {
	spec := corev1ac.ServiceSpec().WithType(corev1.ServiceTypeNodePort).WithSelector(b.Service.Spec.Selector)
	for _, p := range b.allocated() {
		spec.WithPorts(corev1ac.ServicePort().WithName(p.PortName()).WithProtocol(corev1.ProtocolTCP).
			WithPort(p.Port).WithTargetPort(p.TargetPort).WithNodePort(p.NodePort))
	}
	return guestService(gwb, b, b.NodePortService).WithSpec(spec)
}

// GuestExternalNameService is the guest Service a bridged APIService references: an
// ExternalName for the host Service's DNS name, which the aggregator dials at the
// APIService's port.
func GuestExternalNameService(gwb *guestnetv1.GuestWebhookBridge, b *Backend) *corev1ac.ServiceApplyConfiguration {
	spec := corev1ac.ServiceSpec().WithType(corev1.ServiceTypeExternalName).
		WithExternalName(hostnames.ServiceDNSName(HostNamespace(gwb), b.HostService))
	for _, p := range b.allocated() {
		spec.WithPorts(corev1ac.ServicePort().WithName(p.PortName()).WithProtocol(corev1.ProtocolTCP).
			WithPort(p.Port).WithTargetPort(intstr.FromInt32(p.Port)))
	}
	return guestService(gwb, b, b.ExternalNameService).WithSpec(spec)
}

func guestService(gwb *guestnetv1.GuestWebhookBridge, b *Backend, name string) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(name, b.Service.Namespace).
		WithLabels(ownership.BridgeGuestLabels(gwb)).
		WithAnnotations(map[string]string{ownership.BridgeAnnotation: ownership.BridgeID(gwb)})
}

// HostService is the host ClusterIP Service for the backend, in the Cluster's namespace,
// owned by the bridge: it selects the cluster's worker virt-launcher pods and forwards each
// port to the bridge's guest nodePort on them. Its DNS name is what the guest apiserver dials.
func HostService(gwb *guestnetv1.GuestWebhookBridge, b *Backend) *corev1ac.ServiceApplyConfiguration {
	spec := corev1ac.ServiceSpec().WithType(corev1.ServiceTypeClusterIP).
		WithSelector(virtlauncher.WorkerSelector(HostNamespace(gwb), gwb.Spec.ClusterName))
	for _, p := range b.allocated() {
		spec.WithPorts(corev1ac.ServicePort().WithName(p.PortName()).WithProtocol(corev1.ProtocolTCP).
			WithPort(p.Port).WithTargetPort(intstr.FromInt32(p.NodePort)))
	}
	return corev1ac.Service(b.HostService, HostNamespace(gwb)).
		WithLabels(ownership.BridgeHostLabels(gwb, b.Service.Namespace, b.Service.Name)).
		WithAnnotations(map[string]string{ownership.BridgeAnnotation: ownership.BridgeID(gwb)}).
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(guestnetv1.GroupVersion.String()).WithKind("GuestWebhookBridge").
			WithName(gwb.Name).WithUID(gwb.UID).WithController(true).WithBlockOwnerDeletion(true)).
		WithSpec(spec)
}

// Block stops the bridging of every target of backend b (a host or guest object in the way):
// nothing is rewritten; targets rewritten before stay as they are (taking them back would
// not make them work) and report the reason.
func (p *Plan) Block(b *Backend, reason, message string) {
	for i := range p.Targets {
		tp := &p.Targets[i]
		if tp.Backend != b || tp.Reason != "" {
			continue
		}
		tp.Reason, tp.Message = reason, message
		tp.Bridged = false
		tp.Action = NoAction
		tp.Desired = tp.Own // nothing is written: the record stays as it is, if any
	}
}

// Used reports whether a target of the plan goes through backend b: only then does the
// bridge keep Services for it.
func (p *Plan) Used(b *Backend) bool {
	for i := range p.Targets {
		if p.Targets[i].Backend == b {
			return b.Usable()
		}
	}
	return false
}
