package diagnose

import (
	"errors"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// controlPlaneIdentityOf is a GuestNodeIdentity "ids" of the fixture's Cluster asking for the
// control plane address ip, its ControlPlaneAddress condition cond (none when nil).
func controlPlaneIdentityOf(ip string, c *metav1.Condition) guestnetv1.GuestNodeIdentity {
	gni := guestnetv1.GuestNodeIdentity{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ids"},
		Spec:       guestnetv1.GuestNodeIdentitySpec{ClusterName: clusterName, ControlPlane: &guestnetv1.ControlPlaneAddressSpec{IP: ip}},
	}
	if c != nil {
		gni.Status.Conditions = []metav1.Condition{*c}
	}
	return gni
}

func controlPlaneReady() *metav1.Condition {
	c := cond(guestnetv1.ControlPlaneAddressCondition, metav1.ConditionTrue, guestnetv1.ControlPlaneAddressReadyReason,
		"Service k0smotron/kmc-tenant-a-lb has 10.2.6.221 (GuestIngressPolicy tenants admits it)")
	return &c
}

func setEndpoint(s *State, host string) {
	s.Cluster.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: host, Port: 6443}
}

const fixLoadBalancer = "give the control plane a load-balancer address: recreate the Cluster with a GuestNodeIdentity whose spec.controlPlane names it, " +
	"present from the start (Cluster API sets the endpoint once; docs/node-identity.md#the-control-plane-address), " +
	"and spec.service.type: LoadBalancer on K0smotronControlPlane tenant-a (loadBalancerClass unset or io.cilium/l2-announcer)"

func TestDiagnose_ControlPlaneEndpointOK(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	rep := Diagnose(s)
	r := find(t, rep, CheckControlPlaneEndpoint, "")
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("the workers reach their control plane at 10.2.6.221:6443, the load-balancer address of Service kmc-tenant-a-lb"))
	g.Expect(r.Fix).To(BeEmpty())
	g.Expect(r.Runbook).To(BeEmpty())

	// The join address comes after the guest's webhooks and before the guest's Nodes.
	order := map[string]int{}
	for i, res := range rep.Results {
		if _, seen := order[res.Check]; !seen {
			order[res.Check] = i
		}
	}
	g.Expect(order[CheckControlPlaneEndpoint]).To(BeNumerically(">", order[CheckKonnectivity]))
	g.Expect(order[CheckControlPlaneEndpoint]).To(BeNumerically("<", order[CheckNodeAddress]))

	// An IPv6 address is the same whatever its spelling.
	s.Services[len(s.Services)-1].Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "fd00:2:6::221"}}
	setEndpoint(s, "fd00:2:6:0:0:0:0:221")
	r = checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("the workers reach their control plane at [fd00:2:6:0:0:0:0:221]:6443, the load-balancer address of Service kmc-tenant-a-lb"))

	// A load balancer that hands out a name.
	s.Services[len(s.Services)-1].Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{Hostname: "cp.tenant-a.example.com"}}
	setEndpoint(s, "CP.tenant-a.example.com.")
	g.Expect(checkControlPlaneEndpoint(s).Verdict).To(Equal(OK))

	// Not set yet: nothing to check.
	s.Cluster.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{}
	r = checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("the Cluster has no spec.controlPlaneEndpoint yet: its control plane provider sets it"))
}

// The field report's join addresses: a VM reaches them, the tenant's users do not, and a pod
// IP changes.
func TestDiagnose_ControlPlaneEndpointNotALoadBalancer(t *testing.T) {
	tests := []struct {
		name   string
		change func(s *State)
		detail string
	}{
		{name: "a pod IP", change: func(s *State) { setEndpoint(s, controlPlanePodIP) },
			detail: "the workers join at 10.244.0.9:6443, the IP of pod kmc-tenant-a-0: reachable from the VMs, but it changes when the pod restarts and is not announced outside the host"},
		{name: "a ClusterIP", change: func(s *State) { setEndpoint(s, controlPlaneClusterIP) },
			detail: "the workers join at 10.97.0.100:6443, the ClusterIP of Service kmc-tenant-a-lb: reachable from the VMs only, not by the tenant's users; " +
				"k0s would write a host ClusterIP into the guest `kubernetes` Endpoints"},
		{name: "a ClusterIP of a Service of another type", change: func(s *State) {
			s.Services[len(s.Services)-1].Spec.Type = corev1.ServiceTypeClusterIP
			s.Services[len(s.Services)-1].Status = corev1.ServiceStatus{}
			setEndpoint(s, controlPlaneClusterIP)
		}, detail: "the workers join at 10.97.0.100:6443, the ClusterIP of Service kmc-tenant-a-lb: reachable from the VMs only"},
		{name: "a Service name", change: func(s *State) { setEndpoint(s, "kmc-tenant-a-lb.k0smotron.svc.cluster.local") },
			detail: "the workers join at kmc-tenant-a-lb.k0smotron.svc.cluster.local:6443, the name of Service kmc-tenant-a-lb: it resolves only through the host's DNS, " +
				"from the VMs, not for the tenant's users; k0s would resolve it into a host ClusterIP in the guest `kubernetes` Endpoints"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			s := healthy(t)
			tt.change(s)
			rep := Diagnose(s)
			r := find(t, rep, CheckControlPlaneEndpoint, "")
			g.Expect(r.Verdict).To(Equal(Warn), r.Line())
			g.Expect(r.Detail).To(HavePrefix(tt.detail))
			g.Expect(r.Fix).To(Equal(fixLoadBalancer))
			g.Expect(r.Runbook).To(Equal("docs/runbook.md#control-plane-endpoint"))
			g.Expect(rep.Verdict).To(Equal(Warn))
			g.Expect(rep.ExitCode()).To(Equal(ExitOK))
		})
	}

	// Another control plane provider: its Service is named in spec.controlPlane.serviceName.
	g := NewWithT(t)
	s := healthy(t)
	s.Cluster.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KamajiControlPlane", Name: clusterName}
	setEndpoint(s, controlPlanePodIP)
	r := checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(Warn), r.Line())
	g.Expect(r.Fix).To(HaveSuffix("and a host Service of type LoadBalancer from the control plane provider (loadBalancerClass unset or io.cilium/l2-announcer; " +
		"for k0smotron, spec.service.type: LoadBalancer on the K0smotronControlPlane), named in spec.controlPlane.serviceName unless it is k0smotron's"))
}

// An address outside the namespace may be right: diagnose says it cannot tell, unless the
// pods could not be read (it may be a pod IP).
func TestDiagnose_ControlPlaneEndpointUnknown(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	setEndpoint(s, "192.0.2.10")
	r := checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("the workers join at 192.0.2.10:6443, which is not a load-balancer address, pod IP, ClusterIP or Service name of namespace k0smotron: " +
		"diagnose cannot tell whether a VM reaches it"))
	g.Expect(r.Fix).To(BeEmpty())

	// A Service that is no longer a LoadBalancer: an ingress left in its status is no
	// load-balancer address.
	setEndpoint(s, controlPlaneIP)
	s.Services[len(s.Services)-1].Spec.Type = corev1.ServiceTypeNodePort
	g.Expect(checkControlPlaneEndpoint(s).Detail).To(ContainSubstring("diagnose cannot tell"))

	// A pod that is gone is not the control plane's.
	setEndpoint(s, controlPlanePodIP)
	s.Pods[len(s.Pods)-1].Status.Phase = corev1.PodSucceeded
	g.Expect(checkControlPlaneEndpoint(s).Detail).To(ContainSubstring("diagnose cannot tell"))

	s.Pods, s.PodsErr = nil, errors.New(`pods is forbidden: User "x" cannot list resource "pods"`)
	r = checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(Warn), r.Line())
	g.Expect(r.Detail).To(HaveSuffix("diagnose cannot tell whether a VM reaches it (the pods of namespace k0smotron cannot be read: it may be a pod IP)"))
	g.Expect(r.Fix).To(Equal("run diagnose with an identity that may list pods there; or " + fixLoadBalancer))
	g.Expect(r.Runbook).To(Equal(rbControlPlaneEndpoint))
}

func TestDiagnose_ControlPlaneEndpointOfAGuestNodeIdentity(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.NodeIdentities = []guestnetv1.GuestNodeIdentity{controlPlaneIdentityOf(controlPlaneIP, controlPlaneReady())}
	r := checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(OK), r.Line())
	g.Expect(r.Detail).To(Equal("the workers reach their control plane at 10.2.6.221:6443, the load-balancer address of Service kmc-tenant-a-lb (GuestNodeIdentity ids's spec.controlPlane)"))

	// A GuestNodeIdentity without spec.controlPlane asks for nothing: the address is judged alone.
	s.NodeIdentities = []guestnetv1.GuestNodeIdentity{{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ids"}, Spec: guestnetv1.GuestNodeIdentitySpec{ClusterName: clusterName}}}
	setEndpoint(s, controlPlanePodIP)
	g.Expect(checkControlPlaneEndpoint(s).Verdict).To(Equal(Warn))

	// The address is ready, but the Service lost it since guestnet looked.
	s.NodeIdentities = []guestnetv1.GuestNodeIdentity{controlPlaneIdentityOf(controlPlaneIP, controlPlaneReady())}
	setEndpoint(s, controlPlaneIP)
	s.Services[len(s.Services)-1].Status.LoadBalancer.Ingress = nil
	r = checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(Warn), r.Line())
	g.Expect(r.Detail).To(Equal("the workers join at 10.2.6.221:6443, the control plane address of GuestNodeIdentity ids, whose ControlPlaneAddress is True, " +
		"but no LoadBalancer Service of namespace k0smotron has it now"))
	g.Expect(r.Fix).To(Equal("guestnet sees it at its next reconcile of the GuestNodeIdentity; if it stays, check Cilium LB-IPAM " +
		"(kubectl describe svc kmc-tenant-a-lb -n k0smotron; kubectl describe gni ids -n k0smotron)"))
}

// Cluster API set the endpoint before the GuestNodeIdentity's address was there.
func TestDiagnose_ControlPlaneEndpointElsewhere(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	elsewhere := cond(guestnetv1.ControlPlaneAddressCondition, metav1.ConditionFalse, guestnetv1.ControlPlaneEndpointElsewhereReason, "Service k0smotron/kmc-tenant-a-lb has 10.2.6.221, but ...")
	s.NodeIdentities = []guestnetv1.GuestNodeIdentity{controlPlaneIdentityOf(controlPlaneIP, &elsewhere)}
	setEndpoint(s, controlPlanePodIP)
	rep := Diagnose(s)
	r := find(t, rep, CheckControlPlaneEndpoint, "")
	g.Expect(r.Verdict).To(Equal(Fail), r.Line())
	g.Expect(r.Detail).To(Equal("the workers join at 10.244.0.9:6443, the IP of pod kmc-tenant-a-0, not at 10.2.6.221, the control plane address of GuestNodeIdentity ids: " +
		"the Cluster's endpoint was set before that address was there, and Cluster API never changes it"))
	g.Expect(r.Fix).To(Equal("recreate the Cluster with GuestNodeIdentity ids (spec.controlPlane.ip 10.2.6.221) present from the start: " +
		"Cluster API sets spec.controlPlaneEndpoint once, and kubeconfigs and certificates carry it"))
	g.Expect(r.Runbook).To(Equal("docs/runbook.md#control-plane-endpoint"))
	g.Expect(rep.ExitCode()).To(Equal(ExitFail))

	// An address diagnose knows nothing of: the same.
	setEndpoint(s, "192.0.2.10")
	r = checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(Fail), r.Line())
	g.Expect(r.Detail).To(HavePrefix("the workers join at 192.0.2.10:6443, not at 10.2.6.221, the control plane address of GuestNodeIdentity ids"))
}

// The GuestNodeIdentity asks for an address it does not have: its ControlPlaneAddress
// condition says why, and diagnose what to do.
func TestDiagnose_ControlPlaneAddressNotReady(t *testing.T) {
	tests := []struct {
		reason, message string
		fix             string
	}{
		{reason: guestnetv1.NoPolicyReason, message: "No GuestIngressPolicy selects namespace k0smotron",
			fix: "the host admin creates a GuestIngressPolicy whose namespaceSelector selects namespace k0smotron and whose addresses hold 10.2.6.221 (kubectl get gip)"},
		{reason: guestnetv1.NotAllowedReason, message: "No GuestIngressPolicy that selects namespace k0smotron allows 10.2.6.221",
			fix: "the host admin extends the GuestIngressPolicy that selects namespace k0smotron to 10.2.6.221"},
		{reason: guestnetv1.HostAddressReason, message: "10.2.6.221 is an address of the host",
			fix: "10.2.6.221 is one of the host's own addresses and is never admitted: recreate the GuestNodeIdentity and the Cluster with another address"},
		{reason: guestnetv1.ControlPlaneServiceNotFoundReason, message: "Service k0smotron/kmc-tenant-a-lb does not exist (yet)",
			fix: "the control plane provider must create its host Service: spec.service.type: LoadBalancer on K0smotronControlPlane tenant-a"},
		{reason: guestnetv1.ControlPlaneServiceNotLoadBalancerReason, message: "Service k0smotron/kmc-tenant-a-lb is of type ClusterIP, not LoadBalancer",
			fix: "make Service kmc-tenant-a-lb of type LoadBalancer, served by Cilium: spec.service.type: LoadBalancer on K0smotronControlPlane tenant-a"},
		{reason: guestnetv1.HostObjectConflictReason, message: "CiliumLoadBalancerIPPool k0smotron.tenant-a.control-plane exists and is not guestnet's",
			fix: "a CiliumLoadBalancerIPPool or CiliumL2AnnouncementPolicy of guestnet's name is not guestnet's: delete it, or ask the host admin"},
		{reason: guestnetv1.CiliumLBIPAMNotInstalledReason, message: "the host does not serve CiliumLoadBalancerIPPool: install Cilium with LB-IPAM and L2 announcements",
			fix: "the host serves no Cilium pools or L2 announcement policies: install Cilium with LB-IPAM and L2 announcements"},
		{reason: guestnetv1.PoolConflictReason, message: "Cilium does not hand out 10.2.6.221",
			fix: "another pool holds 10.2.6.221, so Cilium hands out neither: the host admin removes the overlap (kubectl get ippools)"},
		{reason: guestnetv1.IPPendingReason, message: "Waiting for Cilium LB-IPAM to give Service k0smotron/kmc-tenant-a-lb the address 10.2.6.221",
			fix: "check Cilium LB-IPAM: the Service's cilium.io/IPAMRequestSatisfied condition says why (kubectl describe svc kmc-tenant-a-lb -n k0smotron)"},
		{reason: guestnetv1.InternalErrorReason, message: "boom", fix: "act on the condition's message"},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			g := NewWithT(t)
			s := healthy(t)
			c := cond(guestnetv1.ControlPlaneAddressCondition, metav1.ConditionFalse, tt.reason, tt.message)
			c.LastTransitionTime = metav1.NewTime(now.Add(-time.Hour))
			s.NodeIdentities = []guestnetv1.GuestNodeIdentity{controlPlaneIdentityOf(controlPlaneIP, &c)}
			// The Service has no address yet; k0smotron waits for it.
			s.Services[len(s.Services)-1].Status.LoadBalancer.Ingress = nil
			s.Cluster.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{}
			rep := Diagnose(s)
			r := find(t, rep, CheckControlPlaneEndpoint, "ids")
			g.Expect(r.Verdict).To(Equal(Fail), r.Line())
			g.Expect(r.Detail).To(Equal("GuestNodeIdentity ids asks for the control plane address 10.2.6.221, but ControlPlaneAddress=False " + tt.reason + ": " +
				tt.message + "; the Cluster has no control plane endpoint yet"))
			g.Expect(r.Fix).To(HavePrefix(tt.fix))
			g.Expect(r.Fix).To(HaveSuffix(" (kubectl describe gni ids -n k0smotron)"))
			g.Expect(r.Runbook).To(Equal("docs/runbook.md#control-plane-endpoint"))
			g.Expect(rep.ExitCode()).To(Equal(ExitFail))
		})
	}

	g := NewWithT(t)
	s := healthy(t)
	pending := cond(guestnetv1.ControlPlaneAddressCondition, metav1.ConditionFalse, guestnetv1.IPPendingReason, "Waiting for Cilium LB-IPAM")
	pending.LastTransitionTime = metav1.NewTime(now.Add(-10 * time.Second))
	s.NodeIdentities = []guestnetv1.GuestNodeIdentity{controlPlaneIdentityOf(controlPlaneIP, &pending)}
	s.Services[len(s.Services)-1].Status.LoadBalancer.Ingress = nil

	// The endpoint is the address already: nothing answers there until the Service has it.
	r := checkControlPlaneEndpoint(s)
	g.Expect(r.Object).To(Equal("ids"))
	g.Expect(r.Detail).To(HaveSuffix("; the workers join at 10.2.6.221:6443, which answers only once the Service has it"))
	// For seconds, Cilium may still be at it.
	g.Expect(r.Verdict).To(Equal(Warn), r.Line())
	g.Expect(r.Fix).To(HavePrefix("run diagnose again in a minute; if it stays, check Cilium LB-IPAM"))
	// Not a refusal, though.
	s.NodeIdentities[0].Status.Conditions[0].Reason = guestnetv1.NoPolicyReason
	g.Expect(checkControlPlaneEndpoint(s).Verdict).To(Equal(Fail))
}

func TestDiagnose_ControlPlaneAddressNotReconciled(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.NodeIdentities = []guestnetv1.GuestNodeIdentity{controlPlaneIdentityOf(controlPlaneIP, nil)}
	r := checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(Warn), r.Line())
	g.Expect(r.Detail).To(Equal("GuestNodeIdentity ids asks for the control plane address 10.2.6.221 and has no ControlPlaneAddress condition yet: guestnet's manager has not reconciled it"))
	g.Expect(r.Fix).To(Equal("run diagnose again in a few seconds; if it stays, " + fixManager))
	g.Expect(r.Runbook).To(Equal(rbManager))

	paused := cond(guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason, "")
	s.NodeIdentities[0].Status.Conditions = []metav1.Condition{paused}
	r = checkControlPlaneEndpoint(s)
	g.Expect(r.Verdict).To(Equal(Warn), r.Line())
	g.Expect(r.Detail).To(HaveSuffix("has no ControlPlaneAddress condition yet: it is paused"))
	g.Expect(r.Fix).To(Equal("lift the pause"))
}

// The join address is the host's: it is checked when the guest cannot be read, too.
func TestDiagnose_ControlPlaneEndpointWithoutTheGuest(t *testing.T) {
	g := NewWithT(t)
	s := healthy(t)
	s.Guest.Err = errors.New("unreachable")
	setEndpoint(s, controlPlanePodIP)
	g.Expect(find(t, Diagnose(s), CheckControlPlaneEndpoint, "").Verdict).To(Equal(Warn))
}
