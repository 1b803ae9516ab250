package ingress

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// Result is what applying a plan did, and what the controller read after it.
type Result struct {
	// GuestService is the guest Service after the apply (the observed one when nothing was
	// applied; nil when it does not exist).
	GuestService *corev1.Service
	// GuestRefused is set when the guest apiserver refused the apply: its message;
	// NodePortHolders are set when it refused a nodePort another guest Service holds.
	GuestRefused    string
	NodePortHolders []string
	NodePortHeld    bool

	// HostService is the host Service after the apply (the observed one when nothing was
	// applied, nil when there is none).
	HostService *corev1.Service
	// HostRejected is set when the host apiserver refused an object: which, and its message.
	HostRejected string

	// HeldGuestService is the guest Service guestnet holds for the GuestIngress after the
	// apply (status.guestService): the one it held, nil once given back, the spec's once taken.
	HeldGuestService *guestnetv1.ObjectReference

	// ReadyEndpoints and TotalEndpoints count the host Service's worker endpoints.
	ReadyEndpoints, TotalEndpoints int32
	// PortsDeclared is the PortsDeclared condition as internal/ports assessed it; nil when
	// the guest could not be read.
	PortsDeclared *metav1.Condition
}

// Condition types of a GuestIngress, in the order Ready summarises them (the first that is
// False gives Ready its reason).
var (
	// baseConditions are reported in every state.
	baseConditions = []string{guestnetv1.AdmittedCondition, guestnetv1.ClusterAvailableCondition}
	// ExposureConditions describe the chain guestnet builds; they are reported while the
	// GuestIngress may hold host objects.
	ExposureConditions = []string{
		guestnetv1.GuestServiceReadyCondition,
		guestnetv1.LoadBalancerReadyCondition,
		guestnetv1.EndpointsReadyCondition,
		guestnetv1.PortsDeclaredCondition,
	}
	// SummarisedConditions are all the conditions Ready may summarise.
	SummarisedConditions = append(append([]string{}, baseConditions...), ExposureConditions...)
)

// SetStatus derives the status of gi (but ClusterAvailable, Paused and Ready, which the
// controller sets with internal/clusterscope) from what the reconcile observed, planned and
// did, in one place: every field and condition it owns is set (or removed) on every call, so
// nothing of an earlier reconcile survives. It returns the condition types Ready summarises
// in this state.
func SetStatus(gi *guestnetv1.GuestIngress, o *Observed, p *Plan, r *Result) (summarised []string) {
	SetAdmitted(gi, o.Admission)
	gi.Status.GuestService = r.HeldGuestService
	summarised = append(summarised, baseConditions...)

	if p.Withdraw && p.Refusal == nil {
		// No Cluster, or not admitted: there is no chain to report on.
		for _, c := range ExposureConditions {
			conditions.Delete(gi, c)
		}
		clearHostStatus(gi)
		return summarised
	}
	if p.Refusal != nil {
		set(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, p.Refusal.Reason, p.Refusal.Message)
		conditions.Delete(gi, guestnetv1.GuestServiceReadyCondition)
		conditions.Delete(gi, guestnetv1.PortsDeclaredCondition)
		if p.Withdraw {
			clearHostStatus(gi)
			SetNoHostService(gi)
		} else {
			setHostFields(gi, r)
		}
		return append(summarised, guestnetv1.LoadBalancerReadyCondition, guestnetv1.EndpointsReadyCondition)
	}

	summarised = append(summarised, ExposureConditions...)
	if !o.GuestReachable {
		set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionUnknown, guestnetv1.GuestUnreachableReason,
			"guestnet cannot read Service "+guestServiceRef(gi)+" in the guest: see ClusterAvailable")
		set(gi, guestnetv1.PortsDeclaredCondition, metav1.ConditionUnknown, guestnetv1.GuestUnreachableReason,
			"guestnet cannot read the guest's port requirements: see ClusterAvailable")
	} else {
		setGuestServiceStatus(gi, p, r)
		if r.PortsDeclared != nil {
			conditions.Set(gi, *r.PortsDeclared)
		} else {
			set(gi, guestnetv1.PortsDeclaredCondition, metav1.ConditionUnknown, guestnetv1.InternalErrorReason,
				"guestnet could not assess the worker ports in this reconcile; it retries")
		}
	}
	setHostFields(gi, r)
	setLoadBalancerStatus(gi, o, p, r)
	return summarised
}

// StatusPorts are the guest nodePorts behind the spec ports as status.ports reports them:
// those the host Service forwards to when there is one, else those the plan resolved.
func StatusPorts(gi *guestnetv1.GuestIngress, p *Plan, hostService *corev1.Service) []guestnetv1.IngressPortStatus {
	if hostService == nil {
		return p.Ports
	}
	forwarded := map[string]int32{}
	for _, sp := range hostService.Spec.Ports {
		forwarded[sp.Name] = sp.TargetPort.IntVal
	}
	out := make([]guestnetv1.IngressPortStatus, 0, len(gi.Spec.Ports))
	for _, sp := range gi.Spec.Ports {
		out = append(out, guestnetv1.IngressPortStatus{Name: sp.Name, Port: sp.Port, NodePort: forwarded[sp.Name]})
	}
	return out
}

func clearHostStatus(gi *guestnetv1.GuestIngress) {
	gi.Status.LoadBalancerIP, gi.Status.HostService, gi.Status.ReadyEndpoints = "", "", 0
}

// setHostFields reports the host Service as it is after the reconcile: IP, name, endpoints.
func setHostFields(gi *guestnetv1.GuestIngress, r *Result) {
	clearHostStatus(gi)
	if r.HostService == nil {
		SetNoHostService(gi)
		return
	}
	gi.Status.HostService = r.HostService.Name
	gi.Status.LoadBalancerIP = LoadBalancerIP(r.HostService)
	gi.Status.ReadyEndpoints = r.ReadyEndpoints
	SetEndpoints(gi, r.HostService.Namespace, r.HostService.Name, r.ReadyEndpoints, r.TotalEndpoints)
}

func setGuestServiceStatus(gi *guestnetv1.GuestIngress, p *Plan, r *Result) {
	gi.Status.Ports = StatusPorts(gi, p, r.HostService)
	noClientAddress, missingFamilies := GuestServiceKeepsNoClientAddress(gi, r.GuestService), GuestServiceMissesFamilies(gi, r.GuestService)
	switch {
	case r.GuestService == nil:
		SetGuestServiceNotFound(gi)
	case p.NoNodePorts != "":
		set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.NoNodePortsReason, p.NoNodePorts)
	case r.NodePortHeld:
		SetNodePortConflict(gi, r.NodePortHolders, r.GuestRefused)
	case r.GuestRefused != "":
		SetGuestServiceRejected(gi, r.GuestRefused)
	case len(p.MissingPorts) > 0:
		SetGuestServicePortNotFound(gi, r.GuestService, p.MissingPorts)
	case noClientAddress != "":
		set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServiceTrafficPolicyReason, noClientAddress)
	case missingFamilies != "":
		set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServiceFamiliesReason, missingFamilies)
	default:
		SetGuestServiceReady(gi, p.Ports)
	}
}

// GuestServiceKeepsNoClientAddress says, for a GuestIngress of externalTrafficPolicy Local,
// why the client's address does not reach the ingress controller ("" when it does): the
// guest's kube-proxy masquerades nodePort traffic of a Service of externalTrafficPolicy
// Cluster, and may forward it to another node. guestnet does not change the guest Service's
// traffic policy (the ingress controller's chart owns it): the message says what to set.
func GuestServiceKeepsNoClientAddress(gi *guestnetv1.GuestIngress, svc *corev1.Service) string {
	if !Local(gi) || svc == nil || svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		return ""
	}
	return fmt.Sprintf("spec.loadBalancer.externalTrafficPolicy is Local, but Service %s in the guest has externalTrafficPolicy %s: the guest's "+
		"kube-proxy replaces the client's address with its node's. Set externalTrafficPolicy: Local on it (for ingress-nginx and Contour "+
		"charts, the controller Service's externalTrafficPolicy value); guestnet forwards only to the workers that run its pods",
		guestServiceRef(gi), cmp.Or(svc.Spec.ExternalTrafficPolicy, corev1.ServiceExternalTrafficPolicyCluster))
}

// GuestServiceMissesFamilies says which IP families of the host Service the guest Service
// does not serve ("" when it serves them all): kube-proxy serves a Service's nodePorts only
// on the node addresses of the Service's own families, so IPv6 traffic to a guest Service of
// IPv4 alone is refused in the VM.
func GuestServiceMissesFamilies(gi *guestnetv1.GuestIngress, svc *corev1.Service) string {
	if svc == nil {
		return ""
	}
	have := svc.Spec.IPFamilies
	if len(have) == 0 {
		have = []corev1.IPFamily{corev1.IPv4Protocol} // a guest that reports none is single-stack IPv4
	}
	var missing []string
	for _, f := range IPFamilies(gi) {
		if !slices.Contains(have, f) {
			missing = append(missing, string(f))
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("the load-balancer IP is served over %s, but Service %s in the guest has ipFamilies %v: its nodePorts do not answer %s "+
		"in the VMs. Make it dual-stack (ipFamilyPolicy: PreferDualStack, in a dual-stack guest cluster), or drop the family from spec.loadBalancer",
		strings.Join(missing, " and "), guestServiceRef(gi), have, strings.Join(missing, " and "))
}

func setLoadBalancerStatus(gi *guestnetv1.GuestIngress, o *Observed, p *Plan, r *Result) {
	pool, poolName := o.Pool, hostnames.Pool(gi)
	if gi.Spec.LoadBalancer.PoolRef != nil {
		pool, poolName = o.RefPool, gi.Spec.LoadBalancer.PoolRef.Name
	}
	policyName := ""
	if p.L2Policy != nil || (!p.Host && o.L2Policy != nil) {
		policyName = hostnames.L2Policy(gi)
	}
	switch {
	case r.HostRejected != "":
		set(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.HostObjectRejectedReason, r.HostRejected)
	case gi.Spec.LoadBalancer.PoolRef != nil && o.RefPool == nil:
		SetPoolNotFound(gi)
	case pool != nil && poolConflict(pool) != nil:
		SetCiliumPoolConflict(gi, poolName, poolConflict(pool))
	case r.HostService == nil:
		SetHostServicePending(gi, hostnames.HostService(gi))
	case gi.Status.LoadBalancerIP == "":
		SetIPPending(gi, r.HostService, ServiceCondition(r.HostService, IPAMRequestSatisfiedCondition), PoolSelectorHint(o.RefPool, r.HostService))
	default:
		SetLoadBalancerReady(gi, r.HostService, gi.Status.LoadBalancerIP, poolName, policyName)
	}
}

// Withheld is what the tenant's messages of this reconcile leave out, for the manager's log
// (the admin's): which policy that does not select the namespace would admit it, which of
// the platform's pools or which other namespace's GuestIngress stands in the way, what
// Cilium says about a conflicting pool. Empty when nothing was left out.
func Withheld(gi *guestnetv1.GuestIngress, o *Observed, p *Plan) []string {
	var out []string
	if o.Admission.Detail != "" {
		out = append(out, o.Admission.Detail)
	}
	if p.Refusal != nil && p.Refusal.Detail != "" {
		out = append(out, p.Refusal.Detail)
	}
	pool := o.Pool
	if gi.Spec.LoadBalancer.PoolRef != nil {
		pool = o.RefPool
	}
	if pool != nil {
		if c := poolConflict(pool); c != nil {
			out = append(out, fmt.Sprintf("Cilium reports CiliumLoadBalancerIPPool %s as conflicting (%s: %s)", pool.GetName(), c.Reason, c.Message))
		}
	}
	return out
}

// poolConflict is Cilium's PoolConflict condition of the pool when it is True.
func poolConflict(pool *unstructured.Unstructured) *metav1.Condition {
	if c := ObjectCondition(pool, PoolConflictCondition); c != nil && c.Status == metav1.ConditionTrue {
		return c
	}
	return nil
}
