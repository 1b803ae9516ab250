package ingress

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// MaxMessage bounds every condition message guestnet writes on a GuestIngress (the API allows
// 32768 bytes; a summary of six conditions must fit in Ready's).
const MaxMessage = 2048

func set(gi *guestnetv1.GuestIngress, conditionType string, value metav1.ConditionStatus, reason, message string) {
	conditions.Set(gi, metav1.Condition{Type: conditionType, Status: value, Reason: reason, Message: status.Bound(message, MaxMessage)})
}

// SetAdmitted reports the policy's decision.
func SetAdmitted(gi *guestnetv1.GuestIngress, a Admission) {
	status, reason := metav1.ConditionFalse, a.Reason
	if a.Admitted {
		status = metav1.ConditionTrue
	}
	if reason == "" {
		reason = guestnetv1.NotAllowedReason
		if a.Admitted {
			reason = guestnetv1.AdmittedReason
		}
	}
	set(gi, guestnetv1.AdmittedCondition, status, reason, a.Message)
}

func guestServiceRef(gi *guestnetv1.GuestIngress) string {
	return gi.Spec.GuestService.Namespace + "/" + gi.Spec.GuestService.Name
}

// SetGuestServiceNotFound records that the guest Service does not exist (yet). Not an error: guestnet
// watches the guest's Services and carries on when it appears.
func SetGuestServiceNotFound(gi *guestnetv1.GuestIngress) {
	set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServiceNotFoundReason,
		fmt.Sprintf("Waiting for Service %s in the guest cluster: install the ingress controller there (e.g. Contour's envoy), "+
			"or correct spec.guestService. guestnet notices the Service as soon as it is created", guestServiceRef(gi)))
}

// SetGuestServicePortNotFound records that the guest Service lacks some spec ports.
func SetGuestServicePortNotFound(gi *guestnetv1.GuestIngress, svc *corev1.Service, missing []guestnetv1.IngressPort) {
	names := make([]string, len(missing))
	for i, p := range missing {
		names[i] = fmt.Sprintf("%s (%d/%s)", p.Name, p.Port, Protocol(p))
	}
	set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServicePortNotFoundReason,
		fmt.Sprintf("Service %s in the guest has no port for %s; it has %s. Correct spec.ports[].port (it is the guest Service's "+
			"port number, not its targetPort), or add the port to the Service", guestServiceRef(gi), strings.Join(names, ", "), ServicePortsString(svc)))
}

// SetNodePortConflict records that the guest apiserver refused a fixed nodePort because another Service
// holds it. holders names them (NodePortHolders); detail is the apiserver's error.
func SetNodePortConflict(gi *guestnetv1.GuestIngress, holders []string, detail string) {
	who := strings.Join(holders, "; ")
	if who == "" {
		who = "another guest Service holds it"
	}
	set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.NodePortConflictReason,
		fmt.Sprintf("The guest apiserver refused the fixed nodePorts on Service %s: %s (%s). Free the nodePort in the guest, "+
			"or choose another spec.ports[].nodePort; the host objects are left as they were", guestServiceRef(gi), who, detail))
}

// SetGuestServiceReady records that the guest Service exposes every port as a nodePort.
func SetGuestServiceReady(gi *guestnetv1.GuestIngress, resolved []guestnetv1.IngressPortStatus) {
	parts := make([]string, len(resolved))
	for i, p := range resolved {
		parts[i] = fmt.Sprintf("%s %d -> nodePort %d", p.Name, p.Port, p.NodePort)
	}
	set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionTrue, guestnetv1.ReadyReason,
		fmt.Sprintf("Service %s in the guest: %s", guestServiceRef(gi), strings.Join(parts, ", ")))
}

// SetGuestServiceRejected records that the guest apiserver refused the apply for another reason (its message).
func SetGuestServiceRejected(gi *guestnetv1.GuestIngress, message string) {
	set(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.InternalErrorReason,
		fmt.Sprintf("The guest apiserver refused guestnet's change to Service %s: %s", guestServiceRef(gi), message))
}

// SetPoolNotFound records that spec.loadBalancer.poolRef names no pool.
func SetPoolNotFound(gi *guestnetv1.GuestIngress) {
	set(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.PoolNotFoundReason,
		fmt.Sprintf("CiliumLoadBalancerIPPool %s (spec.loadBalancer.poolRef) does not exist: create it, or use spec.loadBalancer.cidrs "+
			"to let guestnet create a pool for this GuestIngress", gi.Spec.LoadBalancer.PoolRef.Name))
}

// SetCiliumPoolConflict records that Cilium marked the pool as overlapping another one.
// Cilium's message names the other pool, which is the platform's or another namespace's:
// the tenant reads its reason only, the admin the message in the manager's log (Withheld).
func SetCiliumPoolConflict(gi *guestnetv1.GuestIngress, pool string, c *metav1.Condition) {
	set(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.PoolConflictReason,
		fmt.Sprintf("Cilium reports CiliumLoadBalancerIPPool %s as conflicting (%s): a pool that overlaps it, of the platform or of another "+
			"namespace's GuestIngress, stops it from allocating. Choose other spec.loadBalancer.cidrs, or ask the host admin (the manager's log "+
			"names the other pool)", pool, c.Reason))
}

// SetIPPending records that the host Service has no load-balancer IP yet. ipam is the Service's
// cilium.io/IPAMRequestSatisfied condition (nil when Cilium has not said anything), hint an
// extra explanation (e.g. a poolRef pool that does not select the Service).
func SetIPPending(gi *guestnetv1.GuestIngress, svc *corev1.Service, ipam *metav1.Condition, hint string) {
	msg := fmt.Sprintf("Waiting for Cilium LB-IPAM to assign an IP to Service %s/%s", svc.Namespace, svc.Name)
	if ipam != nil && ipam.Status != metav1.ConditionTrue {
		msg += fmt.Sprintf("; Cilium says %s=%s (%s: %s)", IPAMRequestSatisfiedCondition, ipam.Status, ipam.Reason, ipam.Message)
	}
	if hint != "" {
		msg += "; " + hint
	}
	msg += ". Check that the Cilium operator runs with LB-IPAM enabled and that a pool selects the Service (kubectl get ippools)"
	set(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.IPPendingReason, msg)
}

// SetHostServicePending records that the host Service is not created yet because the guest nodePorts
// are not known (or not usable); GuestServiceReady says why.
func SetHostServicePending(gi *guestnetv1.GuestIngress, service string) {
	set(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.IPPendingReason,
		fmt.Sprintf("Service %s/%s is created once the guest nodePorts it forwards to are known: see GuestServiceReady", gi.Namespace, service))
}

// SetLoadBalancerReady records that the host Service has its IP.
func SetLoadBalancerReady(gi *guestnetv1.GuestIngress, svc *corev1.Service, ip, pool, policy string) {
	msg := fmt.Sprintf("Service %s/%s has IP %s from CiliumLoadBalancerIPPool %s", svc.Namespace, svc.Name, ip, pool)
	if policy != "" {
		msg += ", announced by CiliumL2AnnouncementPolicy " + policy
	}
	set(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionTrue, guestnetv1.ReadyReason, msg)
}

// SetNoHostService records that there is no host Service to have endpoints (see the other conditions).
func SetNoHostService(gi *guestnetv1.GuestIngress) {
	set(gi, guestnetv1.EndpointsReadyCondition, metav1.ConditionFalse, guestnetv1.NoEndpointsReason,
		"There is no host Service yet; GuestServiceReady and LoadBalancerReady say why")
}

// SetEndpoints reports the host Service's endpoints: ready of total worker virt-launcher
// pods its selector matched.
func SetEndpoints(gi *guestnetv1.GuestIngress, namespace, service string, ready, total int32) {
	sel := virtlauncher.FormatSelector(virtlauncher.WorkerSelector(gi.Namespace, gi.Spec.ClusterName))
	switch {
	case ready > 0:
		set(gi, guestnetv1.EndpointsReadyCondition, metav1.ConditionTrue, guestnetv1.ReadyReason,
			fmt.Sprintf("%d of %d worker virt-launcher pods selected by Service %s/%s are ready", ready, total, namespace, service))
	case total == 0:
		set(gi, guestnetv1.EndpointsReadyCondition, metav1.ConditionFalse, guestnetv1.NoEndpointsReason,
			fmt.Sprintf("The selector %s of Service %s/%s matches no pod in namespace %s: requests to the IP are refused. "+
				"Check that Cluster %s has running worker VMs (kubectl get pods -n %s -l %s); CAPK and KubeVirt put these labels on "+
				"every worker's virt-launcher pod", sel, namespace, service, namespace, gi.Spec.ClusterName, namespace, sel))
	default:
		set(gi, guestnetv1.EndpointsReadyCondition, metav1.ConditionFalse, guestnetv1.NoEndpointsReason,
			fmt.Sprintf("%d worker virt-launcher pods match %s but none is ready: requests to the IP are refused. "+
				"Check the worker VMs (kubectl get vmi,pods -n %s -l %s)", total, sel, namespace, sel))
	}
}

// ServiceCondition reads a condition of a Service (status.conditions).
func ServiceCondition(svc *corev1.Service, conditionType string) *metav1.Condition {
	return meta.FindStatusCondition(svc.Status.Conditions, conditionType)
}
