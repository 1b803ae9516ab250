package ingress

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// GuestService is what guestnet server-side applies to the guest ingress controller's
// Service (live, as read from the guest): type NodePort, and the fixed nodePort of each spec
// port the Service has. Nothing else: the Service's other fields stay with their owners
// (Helm, kubectl), and a port the Service does not have is never added (that is
// GuestServicePortNotFound). Ports whose nodePort guestnet only follows are left out
// entirely, so the guest's allocation stays the guest's.
//
// A LoadBalancer Service already allocates nodePorts: its type is left alone (and, if
// guestnet had set NodePort before, the user who changed it to LoadBalancer owns it now).
// Any other type is applied as NodePort on every apply, also when the Service is NodePort
// already: under server-side apply, leaving the type out of the configuration would give up
// guestnet's ownership and the field would fall back to ClusterIP. Ports are listed in the
// Service's own order, so that the configuration compares equal to what guestnet owns on an
// unchanged Service (and nothing is written).
func GuestService(gi *guestnetv1.GuestIngress, live *corev1.Service) *corev1ac.ServiceApplyConfiguration {
	ac := corev1ac.Service(live.Name, live.Namespace)
	spec := corev1ac.ServiceSpec()
	set := false
	if live.Spec.Type != corev1.ServiceTypeLoadBalancer || !HasNodePorts(live) {
		spec.WithType(corev1.ServiceTypeNodePort)
		set = true
	}
	for _, lp := range live.Spec.Ports {
		p, ok := specPort(gi, lp)
		if !ok || p.NodePort == nil {
			continue
		}
		spec.WithPorts(corev1ac.ServicePort().
			WithPort(lp.Port).
			WithProtocol(protocolOf(lp)).
			WithNodePort(*p.NodePort))
		set = true
	}
	if set {
		ac.WithSpec(spec)
	}
	return ac
}

// Release is the configuration that gives back everything guestnet applied to a guest
// Service: an apply with no fields drops guestnet's ownership, and the fields no other
// manager owns go back to what the apiserver makes of them (see docs/guestingress.md).
func Release(live *corev1.Service) *corev1ac.ServiceApplyConfiguration {
	return corev1ac.Service(live.Name, live.Namespace)
}

// HasNodePorts reports whether a Service of this type allocates nodePorts: NodePort, and
// LoadBalancer unless allocateLoadBalancerNodePorts is false.
func HasNodePorts(svc *corev1.Service) bool {
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort:
		return true
	case corev1.ServiceTypeLoadBalancer:
		return ptr.Deref(svc.Spec.AllocateLoadBalancerNodePorts, true)
	}
	return false
}

func protocolOf(p corev1.ServicePort) corev1.Protocol {
	if p.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return p.Protocol
}

// specPort finds the spec port that names the Service port lp (same number and protocol).
func specPort(gi *guestnetv1.GuestIngress, lp corev1.ServicePort) (guestnetv1.IngressPort, bool) {
	for _, p := range gi.Spec.Ports {
		if p.Port == lp.Port && Protocol(p) == protocolOf(lp) {
			return p, true
		}
	}
	return guestnetv1.IngressPort{}, false
}

// servicePort finds the Service port that spec port p names.
func servicePort(svc *corev1.Service, p guestnetv1.IngressPort) (corev1.ServicePort, bool) {
	for _, sp := range svc.Spec.Ports {
		if sp.Port == p.Port && protocolOf(sp) == Protocol(p) {
			return sp, true
		}
	}
	return corev1.ServicePort{}, false
}

// NodePorts resolves the guest nodePort behind every spec port of gi. From the guest Service
// (svc, nil when it does not exist) when it has the port and a nodePort; else the one last
// observed (gi's status.ports); else, when fixed in spec and the Service does not exist yet,
// the fixed one. missing lists the spec ports the existing Service lacks (or that have no
// nodePort yet). complete is true when every spec port has a nodePort.
func NodePorts(gi *guestnetv1.GuestIngress, svc *corev1.Service) (resolved []guestnetv1.IngressPortStatus, missing []guestnetv1.IngressPort, complete bool) {
	observed := map[string]int32{}
	for _, p := range gi.Status.Ports {
		observed[p.Name] = p.NodePort
	}
	complete = true
	for _, p := range gi.Spec.Ports {
		var nodePort int32
		if svc != nil {
			if sp, ok := servicePort(svc, p); ok && sp.NodePort != 0 && HasNodePorts(svc) {
				nodePort = sp.NodePort
			} else {
				missing = append(missing, p)
			}
		}
		if nodePort == 0 {
			nodePort = observed[p.Name]
		}
		if nodePort == 0 && svc == nil && p.NodePort != nil {
			nodePort = *p.NodePort
		}
		if nodePort == 0 {
			complete = false
		}
		resolved = append(resolved, guestnetv1.IngressPortStatus{Name: p.Name, Port: p.Port, NodePort: nodePort})
	}
	return resolved, missing, complete
}

// NodePortMap turns resolved ports into port name -> nodePort.
func NodePortMap(resolved []guestnetv1.IngressPortStatus) map[string]int32 {
	m := make(map[string]int32, len(resolved))
	for _, p := range resolved {
		m[p.Name] = p.NodePort
	}
	return m
}

// WrongNodePorts lists the fixed spec nodePorts the guest Service does not carry (after an
// apply, that means the guest refused them).
func WrongNodePorts(gi *guestnetv1.GuestIngress, svc *corev1.Service) []guestnetv1.IngressPort {
	var out []guestnetv1.IngressPort
	for _, p := range gi.Spec.Ports {
		if p.NodePort == nil {
			continue
		}
		if sp, ok := servicePort(svc, p); ok && sp.NodePort != *p.NodePort {
			out = append(out, p)
		}
	}
	return out
}

// NodePortHolders names, for each fixed nodePort of gi, the other guest Services that hold
// it: "30080 (port http) is allocated to Service projectcontour/other". The nodePort range
// is shared by every Service and protocol of a cluster.
func NodePortHolders(gi *guestnetv1.GuestIngress, services []corev1.Service) []string {
	var out []string
	for _, p := range gi.Spec.Ports {
		if p.NodePort == nil {
			continue
		}
		var holders []string
		for _, svc := range services {
			if svc.Namespace == gi.Spec.GuestService.Namespace && svc.Name == gi.Spec.GuestService.Name {
				continue
			}
			if slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return sp.NodePort == *p.NodePort }) {
				holders = append(holders, svc.Namespace+"/"+svc.Name)
			}
		}
		if len(holders) > 0 {
			slices.Sort(holders)
			out = append(out, fmt.Sprintf("nodePort %d (port %s) is allocated to Service %s", *p.NodePort, p.Name, strings.Join(holders, ", ")))
		}
	}
	return out
}

// FixedNodePorts lists gi's fixed nodePorts.
func FixedNodePorts(gi *guestnetv1.GuestIngress) []int32 {
	var out []int32
	for _, p := range gi.Spec.Ports {
		if p.NodePort != nil {
			out = append(out, *p.NodePort)
		}
	}
	return out
}

// ServicePortsString renders a Service's ports as "80/TCP, 443/TCP" for messages.
func ServicePortsString(svc *corev1.Service) string {
	parts := make([]string, 0, len(svc.Spec.Ports))
	for _, p := range svc.Spec.Ports {
		parts = append(parts, fmt.Sprintf("%d/%s", p.Port, protocolOf(p)))
	}
	if len(parts) == 0 {
		return "no ports"
	}
	return strings.Join(parts, ", ")
}
