package diagnose

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Diagnose runs every check over what Gather read, in the runbook's order: the Cluster and
// its guest, the workers and what forwards to them, then the guest's webhooks and
// APIServices, then guestnet's own objects.
func Diagnose(s *State) *Report {
	rep := &Report{Namespace: s.Namespace, Cluster: s.ClusterName, Verdict: OK}
	rep.add(checkCluster(s))
	guestOK := false
	if s.Guest != nil {
		rep.add(checkGuest(s))
		guestOK = s.Guest.Err == nil
	}
	rep.add(checkWorkers(s))
	rep.add(checkServices(s)...)
	rep.add(checkPorts(s)...)
	if guestOK {
		rep.add(checkTunnel(s))
		rep.add(checkTargets(s)...)
		rep.add(checkKonnectivity(s))
	}
	// The workers' join address, then their Nodes.
	rep.add(checkControlPlaneEndpoint(s))
	if guestOK {
		rep.add(checkNodes(s)...)
		rep.add(checkCiliumNodes(s)...)
	}
	for i := range s.Ingresses {
		rep.add(checkAdmission(s, &s.Ingresses[i]))
		rep.add(checkGuestIngress(&s.Ingresses[i]))
	}
	for i := range s.Bridges {
		rep.add(checkBridge(&s.Bridges[i]))
	}
	return rep
}

// conditionRunbook says which runbook section explains a condition that is not True.
func conditionRunbook(c *metav1.Condition) string {
	switch c.Type {
	case guestnetv1.ClusterAvailableCondition:
		if c.Reason == guestnetv1.KubeconfigRefusedReason {
			return rbKubeconfigRefused
		}
		return rbGuestUnreachable
	case guestnetv1.LoadBalancerReadyCondition:
		return rbNoIP
	case guestnetv1.EndpointsReadyCondition:
		return rbNoEndpoints
	case guestnetv1.PortsDeclaredCondition:
		switch c.Reason {
		case guestnetv1.RollingOutReason:
			return rbWorkerRollout
		case guestnetv1.RepointRevertedReason, guestnetv1.TemplateNameTakenReason:
			return rbRepointStopped
		}
		return rbUndeclaredPort
	case guestnetv1.TargetsReachableCondition:
		return reasonRunbook(c.Reason)
	case guestnetv1.TargetsBridgedCondition:
		return rbWebhookFailed
	}
	return ""
}

// checkConditions reports a guestnet object from its conditions: Ready, else the first of
// summarised that is not True, with its message (which says what to do).
func checkConditions(r Result, obj metav1.Object, conds []metav1.Condition, observedGeneration int64, ready string, summarised []string, doc string) Result {
	if c := meta.FindStatusCondition(conds, guestnetv1.PausedCondition); c != nil && c.Status == metav1.ConditionTrue {
		r.Verdict, r.Detail = Warn, "paused: "+c.Message
		r.Fix = "lift the pause"
		return r
	}
	readyCond := meta.FindStatusCondition(conds, guestnetv1.ReadyCondition)
	if readyCond == nil {
		r.Verdict, r.Detail = Warn, "no status yet: guestnet's manager has not reconciled it"
		r.Fix, r.Runbook = fixManager, rbManager
		return r
	}
	stale := ""
	if observedGeneration != 0 && observedGeneration < obj.GetGeneration() {
		stale = fmt.Sprintf(" (status of generation %d; the object is at %d)", observedGeneration, obj.GetGeneration())
	}
	if readyCond.Status == metav1.ConditionTrue {
		r.Verdict, r.Detail = OK, "Ready"+ready+stale
		return r
	}
	var notTrue []string
	var first *metav1.Condition
	for _, t := range summarised {
		c := meta.FindStatusCondition(conds, t)
		if c == nil || c.Status == metav1.ConditionTrue {
			continue
		}
		if first == nil {
			first = c
		}
		notTrue = append(notTrue, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	if first == nil {
		r.Verdict, r.Detail = Warn, fmt.Sprintf("Ready=%s %s: %s%s", readyCond.Status, readyCond.Reason, readyCond.Message, stale)
		r.Fix, r.Runbook = "run diagnose again in a few seconds; if it stays, "+fixManager, rbManager
		return r
	}
	r.Verdict, r.Detail = Fail, strings.Join(notTrue, "; ")+stale
	r.Fix = "act on the condition's message (" + doc + ")"
	r.Runbook = conditionRunbook(first)
	return r
}

// checkGuestIngress: the GuestIngress is Ready (the whole chain holds), else the condition
// that breaks it.
func checkGuestIngress(gi *guestnetv1.GuestIngress) Result {
	var ports []string
	for _, p := range gi.Status.Ports {
		ports = append(ports, fmt.Sprintf("%d->%d", p.Port, p.NodePort))
	}
	ready := fmt.Sprintf(": IP %s, %d ready endpoints, host Service %s, ports %s",
		gi.Status.LoadBalancerIP, gi.Status.ReadyEndpoints, gi.Status.HostService, strings.Join(ports, " "))
	return checkConditions(Result{Check: CheckGuestIngress, Object: gi.Name}, gi, gi.Status.Conditions, gi.Status.ObservedGeneration, ready,
		[]string{guestnetv1.ClusterAvailableCondition, guestnetv1.GuestServiceReadyCondition, guestnetv1.LoadBalancerReadyCondition,
			guestnetv1.EndpointsReadyCondition, guestnetv1.PortsDeclaredCondition},
		"docs/guestingress.md#conditions-what-each-says-and-what-to-do")
}

// checkAdmission: a GuestIngressPolicy admits the GuestIngress (guestnet fails closed: a
// GuestIngress no policy admits gets nothing on the host), decided from the policies, pools
// and namespace as they are now, whatever the GuestIngress's status says.
func checkAdmission(s *State, gi *guestnetv1.GuestIngress) Result {
	r := Result{Check: CheckAdmission, Object: gi.Name, Runbook: rbNotAdmitted}
	if s.AdmissionErr != nil {
		r.Verdict, r.Detail = Warn, fmt.Sprintf("the GuestIngressPolicies cannot be read (%v), so admission was not checked", s.AdmissionErr)
		r.Fix = "run diagnose with an identity that may list guestingresspolicies and ciliumloadbalancerippools (the manager's has)"
		return r
	}
	d := s.Admission[gi.Name]
	if d.Admitted {
		r.Verdict, r.Detail, r.Runbook = OK, d.Message, ""
		return r
	}
	r.Verdict, r.Detail = Fail, fmt.Sprintf("not admitted (%s): %s", d.Reason, d.Message)
	if d.Detail != "" {
		// diagnose is the admin's: it says what the tenant's message leaves out.
		r.Detail += " " + d.Detail
	}
	switch d.Reason {
	case guestnetv1.NoPolicyReason:
		r.Fix = fmt.Sprintf("the host admin creates a GuestIngressPolicy whose namespaceSelector selects namespace %s (e.g. "+
			"matchLabels kubernetes.io/metadata.name: %s) and admits what the GuestIngress asks for (kubectl get gip)", gi.Namespace, gi.Namespace)
	case guestnetv1.QuotaExceededReason:
		r.Fix = "delete another GuestIngress of the namespace, or the host admin raises the policy's maxGuestIngressesPerNamespace"
	case guestnetv1.HostAddressReason:
		r.Fix = "change spec.loadBalancer to addresses that leave out the host's own (named above); the host admin can narrow the policy's " +
			"addresses so that they hold none (kubectl get gip: condition HostAddressesOutside)"
	default:
		r.Fix = "change spec.loadBalancer to what a policy that selects the namespace allows, or the host admin extends that policy (kubectl get gip -o yaml)"
	}
	return r
}

// checkBridge: the GuestWebhookBridge is Ready (every target bridged and reachable), else
// the condition that breaks it.
func checkBridge(gwb *guestnetv1.GuestWebhookBridge) Result {
	ready := fmt.Sprintf(": %d of %d targets bridged", gwb.Status.BridgedTargets, gwb.Status.TotalTargets)
	return checkConditions(Result{Check: CheckGuestWebhookBridge, Object: gwb.Name}, gwb, gwb.Status.Conditions, gwb.Status.ObservedGeneration, ready,
		[]string{guestnetv1.ClusterAvailableCondition, guestnetv1.TargetsBridgedCondition, guestnetv1.TargetsReachableCondition,
			guestnetv1.PortsDeclaredCondition},
		"docs/guestwebhookbridge.md#conditions-what-each-says-and-what-to-do")
}
