package ingress

import (
	"cmp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	discoveryv1ac "k8s.io/client-go/applyconfigurations/discovery/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// Client source IPs (docs/client-source-ip.md). With externalTrafficPolicy Local the host
// forwards a connection only to an endpoint on the node it arrived at, without SNAT, and the
// guest's kube-proxy, for a Local guest Service, only to an ingress pod on its own node,
// without SNAT: the client's address arrives. A worker whose VM runs no ingress pod would
// drop what it gets, so the host Service must forward only to the workers that run one. Like
// KubeVirt's cloud provider (pkg/controller/kubevirteps), guestnet then gives the host Service
// no selector and writes its EndpointSlices itself, from the guest Service's EndpointSlices.

// EndpointSliceManagedBy is the endpointslice.kubernetes.io/managed-by value of the
// EndpointSlices guestnet writes (the EndpointSlice controller leaves slices of other
// managers alone).
const EndpointSliceManagedBy = "guestnet.addons.cluster.x-k8s.io"

// Local reports whether gi's host Service keeps client source IPs (externalTrafficPolicy Local).
func Local(gi *guestnetv1.GuestIngress) bool {
	return gi.Spec.LoadBalancer.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// Endpoint is one worker the host Service forwards to: its virt-launcher pod.
type Endpoint struct {
	// Pod is the virt-launcher pod's name; Node the host node it runs on.
	Pod, Node string
	// IPs are the pod's addresses (one per family).
	IPs []string
	// Ready: the pod is ready and not terminating.
	Ready bool
}

// LocalEndpoints are the workers of pods (the Cluster's worker virt-launcher pods) whose guest
// node runs a ready endpoint of the guest Service, per guestSlices (its EndpointSlices). The
// guest Node of a worker is named after its KubevirtMachine (virtlauncher.MachineNameLabel).
func LocalEndpoints(guestSlices []discoveryv1.EndpointSlice, pods []corev1.Pod) []Endpoint {
	nodes := map[string]bool{}
	for i := range guestSlices {
		for _, ep := range guestSlices[i].Endpoints {
			if ep.NodeName != nil && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
				nodes[*ep.NodeName] = true
			}
		}
	}
	var out []Endpoint
	for i := range pods {
		pod := &pods[i]
		if !nodes[pod.Labels[virtlauncher.MachineNameLabel]] || pod.Status.PodIP == "" {
			continue
		}
		e := Endpoint{Pod: pod.Name, Node: pod.Spec.NodeName, Ready: podReady(pod)}
		for _, ip := range pod.Status.PodIPs {
			e.IPs = append(e.IPs, ip.IP)
		}
		if len(e.IPs) == 0 {
			e.IPs = []string{pod.Status.PodIP}
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return cmp.Compare(a.Pod, b.Pod) })
	return out
}

func podReady(pod *corev1.Pod) bool {
	if !pod.DeletionTimestamp.IsZero() {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// HostEndpointSlices are the EndpointSlices of gi's host Service without selector: one per
// family of the Service, each listing the endpoints' addresses of that family at the guest
// nodePorts (nodePorts: port name -> nodePort), named "<host Service>-<family>", marked as
// guestnet's, owned by gi.
func HostEndpointSlices(gi *guestnetv1.GuestIngress, nodePorts map[string]int32, endpoints []Endpoint) []*discoveryv1ac.EndpointSliceApplyConfiguration {
	svc := hostnames.HostService(gi)
	var out []*discoveryv1ac.EndpointSliceApplyConfiguration
	for _, family := range IPFamilies(gi) {
		addressType, suffix := discoveryv1.AddressTypeIPv4, "ipv4"
		if family == corev1.IPv6Protocol {
			addressType, suffix = discoveryv1.AddressTypeIPv6, "ipv6"
		}
		labels := ownership.Labels(gi)
		labels[discoveryv1.LabelServiceName] = svc
		labels[discoveryv1.LabelManagedBy] = EndpointSliceManagedBy
		slice := discoveryv1ac.EndpointSlice(hostnames.ObjectName(svc+"-"+suffix), gi.Namespace).
			WithLabels(labels).
			WithOwnerReferences(controllerRef(gi)).
			WithAddressType(addressType)
		for _, p := range gi.Spec.Ports {
			slice.WithPorts(discoveryv1ac.EndpointPort().WithName(p.Name).WithPort(nodePorts[p.Name]).WithProtocol(Protocol(p)))
		}
		for _, e := range endpoints {
			for _, ip := range e.IPs {
				if strings.Contains(ip, ":") != (family == corev1.IPv6Protocol) {
					continue
				}
				ep := discoveryv1ac.Endpoint().WithAddresses(ip).
					WithConditions(discoveryv1ac.EndpointConditions().WithReady(e.Ready).WithServing(e.Ready).WithTerminating(false)).
					WithTargetRef(corev1ac.ObjectReference().WithKind("Pod").WithNamespace(gi.Namespace).WithName(e.Pod))
				if e.Node != "" {
					ep.WithNodeName(e.Node)
				}
				slice.WithEndpoints(ep)
			}
		}
		out = append(out, slice)
	}
	return out
}

// controllerRef makes gi the controller of a host object (the garbage collector deletes the
// object with it).
func controllerRef(gi *guestnetv1.GuestIngress) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(guestnetv1.GroupVersion.String()).
		WithKind("GuestIngress").
		WithName(gi.Name).
		WithUID(gi.UID).
		WithController(true).
		WithBlockOwnerDeletion(true)
}
