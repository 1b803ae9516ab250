package diagnose

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
)

// The join address check (docs/node-identity-research.md, section 6 and the "Join address" row
// of section 7): the workers join, and the guest's own clients reach the control plane, at the
// Cluster's spec.controlPlaneEndpoint. A hosted control plane's pod IP and its host Service's
// ClusterIP or name work from inside the VMs only, and a pod IP only until the pod restarts;
// the one address that works for the VMs, the tenant's users and k0s's guest `kubernetes`
// Endpoints is a load-balancer IP of the control plane's host Service, which a
// GuestNodeIdentity's spec.controlPlane gives (docs/node-identity.md#the-control-plane-address).

// controlPlaneGrace is how long the control plane's address may wait for its Service or its IP
// before diagnose FAILs it: k0smotron creates the Service, and Cilium hands out the IP, within
// seconds.
const controlPlaneGrace = time.Minute

// endpointKind is what the Cluster's endpoint host is among the objects of its namespace.
type endpointKind int

const (
	endpointUnknown endpointKind = iota
	endpointLoadBalancer
	endpointPodIP
	endpointClusterIP
	endpointServiceName
)

// endpointMatch is the object of the namespace whose address the endpoint host is.
type endpointMatch struct {
	kind   endpointKind
	object string // the Service's or the pod's name
}

// what says what the address is, for a detail ("" when unknown).
func (m endpointMatch) what() string {
	switch m.kind {
	case endpointLoadBalancer:
		return "the load-balancer address of Service " + m.object
	case endpointPodIP:
		return "the IP of pod " + m.object
	case endpointClusterIP:
		return "the ClusterIP of Service " + m.object
	case endpointServiceName:
		return "the name of Service " + m.object
	}
	return ""
}

// matchEndpoint finds whose address host is among the namespace's Services and pods: a
// load-balancer address of a LoadBalancer Service first, then a pod IP, a ClusterIP, a
// Service name.
func matchEndpoint(s *State, host string) endpointMatch {
	for _, svc := range s.Services {
		if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if (in.IP != "" && sameHost(in.IP, host)) || (in.Hostname != "" && sameHost(in.Hostname, host)) {
				return endpointMatch{endpointLoadBalancer, svc.Name}
			}
		}
	}
	for i := range s.Pods {
		p := &s.Pods[i]
		if !p.DeletionTimestamp.IsZero() || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, ip := range podIPs(p) {
			if sameHost(ip, host) {
				return endpointMatch{endpointPodIP, p.Name}
			}
		}
	}
	for _, svc := range s.Services {
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 && svc.Spec.ClusterIP != "" {
			ips = []string{svc.Spec.ClusterIP}
		}
		for _, ip := range ips {
			if ip != corev1.ClusterIPNone && sameHost(ip, host) {
				return endpointMatch{endpointClusterIP, svc.Name}
			}
		}
	}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	for _, svc := range s.Services {
		short := svc.Name + "." + svc.Namespace
		if name == svc.Name || name == short || name == short+".svc" || strings.HasPrefix(name, short+".svc.") {
			return endpointMatch{endpointServiceName, svc.Name}
		}
	}
	return endpointMatch{}
}

// sameHost compares two hosts: IPs by address (whatever their spelling), names without case
// and trailing dot.
func sameHost(a, b string) bool {
	if x, err := netip.ParseAddr(a); err == nil {
		y, err := netip.ParseAddr(b)
		return err == nil && x.Unmap() == y.Unmap()
	}
	return strings.EqualFold(strings.TrimSuffix(a, "."), strings.TrimSuffix(b, "."))
}

// controlPlaneIdentity is the cluster's GuestNodeIdentity that asks for a control plane
// address (the first by name), nil when none does.
func controlPlaneIdentity(s *State) *guestnetv1.GuestNodeIdentity {
	var out *guestnetv1.GuestNodeIdentity
	for i := range s.NodeIdentities {
		gni := &s.NodeIdentities[i]
		if gni.Spec.ControlPlane != nil && (out == nil || gni.Name < out.Name) {
			out = gni
		}
	}
	return out
}

// checkControlPlaneEndpoint: the Cluster's control plane endpoint, the workers' join address,
// is a load-balancer address of a Service of the namespace; with a GuestNodeIdentity that asks
// for a control plane address, it is that address and the address is ready.
func checkControlPlaneEndpoint(s *State) Result {
	r := Result{Check: CheckControlPlaneEndpoint, Runbook: rbControlPlaneEndpoint}
	ep := s.Cluster.Spec.ControlPlaneEndpoint
	host, addr := ep.Host, ep.Host
	if ep.Port != 0 {
		addr = net.JoinHostPort(host, strconv.Itoa(int(ep.Port)))
	}
	m := endpointMatch{}
	if host != "" {
		m = matchEndpoint(s, host)
	}
	if gni := controlPlaneIdentity(s); gni != nil {
		ip := gni.Spec.ControlPlane.IP
		if host != "" && !sameHost(host, ip) {
			r.Verdict = Fail
			r.Detail = fmt.Sprintf("the workers join at %s", addr)
			if w := m.what(); w != "" {
				r.Detail += ", " + w
			}
			r.Detail += fmt.Sprintf(", not at %s, the control plane address of GuestNodeIdentity %s: the Cluster's endpoint was set before that address was there, "+
				"and Cluster API never changes it", ip, gni.Name)
			r.Fix = fmt.Sprintf("recreate the Cluster with GuestNodeIdentity %s (spec.controlPlane.ip %s) present from the start: Cluster API sets spec.controlPlaneEndpoint once, "+
				"and kubeconfigs and certificates carry it", gni.Name, ip)
			return r
		}
		if res, ok := controlPlaneAddressNotReady(s, gni, host, addr); ok {
			return res
		}
		if host != "" && m.kind != endpointLoadBalancer {
			service, _ := nodeidentity.ControlPlaneService(gni, s.Cluster)
			r.Verdict = Warn
			r.Detail = fmt.Sprintf("the workers join at %s, the control plane address of GuestNodeIdentity %s, whose ControlPlaneAddress is True, "+
				"but no LoadBalancer Service of namespace %s has it now", addr, gni.Name, s.Namespace)
			if m.kind != endpointUnknown {
				r.Detail += " (it is " + m.what() + ")"
			}
			r.Fix = fmt.Sprintf("guestnet sees it at its next reconcile of the GuestNodeIdentity; if it stays, check Cilium LB-IPAM (kubectl describe svc %s -n %s; kubectl describe gni %s -n %s)",
				orService(service), s.Namespace, gni.Name, s.Namespace)
			return r
		}
	}
	if host == "" {
		r.Verdict, r.Runbook = OK, ""
		r.Detail = "the Cluster has no spec.controlPlaneEndpoint yet: its control plane provider sets it"
		return r
	}
	switch m.kind {
	case endpointLoadBalancer:
		r.Verdict, r.Runbook = OK, ""
		r.Detail = fmt.Sprintf("the workers reach their control plane at %s, %s", addr, m.what())
		if gni := controlPlaneIdentity(s); gni != nil {
			r.Detail += fmt.Sprintf(" (GuestNodeIdentity %s's spec.controlPlane)", gni.Name)
		}
		return r
	case endpointPodIP:
		r.Verdict = Warn
		r.Detail = fmt.Sprintf("the workers join at %s, %s: reachable from the VMs, but it changes when the pod restarts and is not announced outside the host", addr, m.what())
	case endpointClusterIP:
		r.Verdict = Warn
		r.Detail = fmt.Sprintf("the workers join at %s, %s: reachable from the VMs only, not by the tenant's users; "+
			"k0s would write a host ClusterIP into the guest `kubernetes` Endpoints", addr, m.what())
	case endpointServiceName:
		r.Verdict = Warn
		r.Detail = fmt.Sprintf("the workers join at %s, %s: it resolves only through the host's DNS, from the VMs, not for the tenant's users; "+
			"k0s would resolve it into a host ClusterIP in the guest `kubernetes` Endpoints", addr, m.what())
	default:
		r.Detail = fmt.Sprintf("the workers join at %s, which is not a load-balancer address, pod IP, ClusterIP or Service name of namespace %s: "+
			"diagnose cannot tell whether a VM reaches it", addr, s.Namespace)
		if s.PodsErr != nil {
			// It may be a pod IP, the field report's case.
			r.Verdict = Warn
			r.Detail += fmt.Sprintf(" (the pods of namespace %s cannot be read: it may be a pod IP)", s.Namespace)
			r.Fix = "run diagnose with an identity that may list pods there; or " + controlPlaneAddressFix(s)
			return r
		}
		// An address outside the namespace (an external load balancer, a DNS name) may be
		// right: nothing says it is wrong.
		r.Verdict, r.Runbook = OK, ""
		return r
	}
	r.Fix = controlPlaneAddressFix(s)
	return r
}

// controlPlaneAddressFix: how to give the control plane a load-balancer address.
func controlPlaneAddressFix(s *State) string {
	return fmt.Sprintf("give the control plane a load-balancer address: recreate the Cluster with a GuestNodeIdentity whose spec.controlPlane names it, "+
		"present from the start (Cluster API sets the endpoint once; docs/node-identity.md#the-control-plane-address), and %s", serviceTypeFix(s))
}

// serviceTypeFix: what makes the control plane provider create a LoadBalancer Service.
func serviceTypeFix(s *State) string {
	if ref := s.Cluster.Spec.ControlPlaneRef; ref.Kind == nodeidentity.K0smotronControlPlaneKind && ref.Name != "" {
		return fmt.Sprintf("spec.service.type: LoadBalancer on %s %s (loadBalancerClass unset or %s)", ref.Kind, ref.Name, guestnetv1.DefaultLoadBalancerClass)
	}
	return fmt.Sprintf("a host Service of type LoadBalancer from the control plane provider (loadBalancerClass unset or %s; for k0smotron, spec.service.type: LoadBalancer "+
		"on the K0smotronControlPlane), named in spec.controlPlane.serviceName unless it is k0smotron's", guestnetv1.DefaultLoadBalancerClass)
}

func orService(name string) string {
	if name == "" {
		return "<the control plane's Service>"
	}
	return name
}

// controlPlaneAddressNotReady reports the GuestNodeIdentity's ControlPlaneAddress condition
// when it is not True (false when it is).
func controlPlaneAddressNotReady(s *State, gni *guestnetv1.GuestNodeIdentity, host, addr string) (Result, bool) {
	r := Result{Check: CheckControlPlaneEndpoint, Object: gni.Name, Runbook: rbControlPlaneEndpoint}
	ip := gni.Spec.ControlPlane.IP
	describe := fmt.Sprintf("kubectl describe gni %s -n %s", gni.Name, s.Namespace)
	c := meta.FindStatusCondition(gni.Status.Conditions, guestnetv1.ControlPlaneAddressCondition)
	if c != nil && c.Status == metav1.ConditionTrue {
		return r, false
	}
	if c == nil {
		r.Verdict = Warn
		r.Detail = fmt.Sprintf("GuestNodeIdentity %s asks for the control plane address %s and has no ControlPlaneAddress condition yet", gni.Name, ip)
		if p := meta.FindStatusCondition(gni.Status.Conditions, guestnetv1.PausedCondition); p != nil && p.Status == metav1.ConditionTrue {
			r.Detail += ": it is paused"
			r.Fix = "lift the pause"
			return r, true
		}
		r.Detail += ": guestnet's manager has not reconciled it"
		r.Fix, r.Runbook = "run diagnose again in a few seconds; if it stays, "+fixManager, rbManager
		return r, true
	}
	r.Verdict = Fail
	r.Detail = fmt.Sprintf("GuestNodeIdentity %s asks for the control plane address %s, but ControlPlaneAddress=%s %s: %s", gni.Name, ip, c.Status, c.Reason, c.Message)
	switch {
	case host == "":
		r.Detail += "; the Cluster has no control plane endpoint yet"
	case sameHost(host, ip):
		r.Detail += fmt.Sprintf("; the workers join at %s, which answers only once the Service has it", addr)
	}
	service, _ := nodeidentity.ControlPlaneService(gni, s.Cluster)
	switch c.Reason {
	case guestnetv1.NoPolicyReason:
		r.Fix = fmt.Sprintf("the host admin creates a GuestIngressPolicy whose namespaceSelector selects namespace %s and whose addresses hold %s (kubectl get gip)", s.Namespace, ip)
	case guestnetv1.NotAllowedReason:
		r.Fix = fmt.Sprintf("the host admin extends the GuestIngressPolicy that selects namespace %s to %s (and the interfaces of spec.controlPlane.l2), or change spec.controlPlane.l2 to what it allows; "+
			"spec.controlPlane.ip is immutable: another address means a new GuestNodeIdentity and a new Cluster (kubectl get gip -o yaml)", s.Namespace, ip)
	case guestnetv1.HostAddressReason:
		r.Fix = fmt.Sprintf("%s is one of the host's own addresses and is never admitted: recreate the GuestNodeIdentity and the Cluster with another address; "+
			"the host admin can narrow the policy's addresses so that they hold none of the host's (kubectl get gip)", ip)
	case guestnetv1.ControlPlaneServiceNotFoundReason:
		r.Fix = fmt.Sprintf("the control plane provider must create its host Service: %s; or name the right Service in spec.controlPlane.serviceName", serviceTypeFix(s))
	case guestnetv1.ControlPlaneServiceNotLoadBalancerReason:
		r.Fix = fmt.Sprintf("make Service %s of type LoadBalancer, served by Cilium: %s", orService(service), serviceTypeFix(s))
	case guestnetv1.HostObjectConflictReason:
		r.Fix = "a CiliumLoadBalancerIPPool or CiliumL2AnnouncementPolicy of guestnet's name is not guestnet's: delete it, or ask the host admin"
	case guestnetv1.CiliumLBIPAMNotInstalledReason:
		r.Fix = "the host serves no Cilium pools or L2 announcement policies: install Cilium with LB-IPAM and L2 announcements"
	case guestnetv1.PoolConflictReason:
		r.Fix = fmt.Sprintf("another pool holds %s, so Cilium hands out neither: the host admin removes the overlap (kubectl get ippools)", ip)
	case guestnetv1.IPPendingReason:
		r.Fix = fmt.Sprintf("check Cilium LB-IPAM: the Service's cilium.io/IPAMRequestSatisfied condition says why (kubectl describe svc %s -n %s)", orService(service), s.Namespace)
	case guestnetv1.ControlPlaneEndpointElsewhereReason:
		r.Fix = fmt.Sprintf("recreate the Cluster with GuestNodeIdentity %s present from the start: Cluster API sets spec.controlPlaneEndpoint once", gni.Name)
	default:
		r.Fix = "act on the condition's message"
	}
	r.Fix += " (" + describe + ")"
	// The Service and its IP come within seconds of the Cluster's creation.
	if (c.Reason == guestnetv1.IPPendingReason || c.Reason == guestnetv1.ControlPlaneServiceNotFoundReason) && !s.Now.IsZero() &&
		!c.LastTransitionTime.IsZero() && s.Now.Sub(c.LastTransitionTime.Time) < controlPlaneGrace {
		r.Verdict, r.Fix = Warn, "run diagnose again in a minute; if it stays, "+r.Fix
	}
	return r, true
}
