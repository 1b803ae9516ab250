package bridge

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// maxListed bounds the targets a condition message lists; status.targets has them all.
const maxListed = 5

// bridgedReasons orders the reasons of TargetsBridged=False, most actionable first.
var bridgedReasons = []string{
	guestnetv1.RecordUnreadableReason,
	guestnetv1.TargetClaimedReason,
	guestnetv1.HostObjectConflictReason,
	guestnetv1.TargetNotBridgeableReason,
	guestnetv1.NodePortRangeExhaustedReason,
	guestnetv1.NodePortConflictReason,
	guestnetv1.GuestServiceNotFoundReason,
	guestnetv1.TargetNotFoundReason,
	guestnetv1.APIServiceViaKonnectivityReason,
	guestnetv1.WaitingForAvailabilityReason,
	guestnetv1.TooManyTargetsReason,
}

// maxListedMessage bounds the message of one target in a condition message.
const maxListedMessage = guestnetv1.MaxTargetMessage

// reachableReasons orders the reasons of TargetsReachable=False.
var reachableReasons = []string{
	guestnetv1.EndpointUnreachableReason,
	guestnetv1.TLSUnverifiedReason,
	guestnetv1.TLSNameMismatchReason,
}

// SetProbe records a probe of a target that goes through the bridge, with what to do when it
// failed. addr is where the host Service of the target's backend was probed.
func (tp *TargetPlan) SetProbe(r ProbeResult, gwb *guestnetv1.GuestWebhookBridge, addr string) {
	tp.Probe = &r
	switch {
	case !r.Answered:
		tp.Reason = guestnetv1.EndpointUnreachableReason
		ns := HostNamespace(gwb)
		tp.Message = fmt.Sprintf("no answer through host Service %s/%s (%s): %s. Check that it has ready endpoints "+
			"(kubectl get endpointslices -n %s -l kubernetes.io/service-name=%s: the worker virt-launcher pods %s), "+
			"that the workers declare nodePort %d (condition PortsDeclared), and that the pods behind %s are ready in the guest",
			ns, tp.Backend.HostService, addr, r.Detail, ns, tp.Backend.HostService,
			virtlauncher.FormatSelector(virtlauncher.WorkerSelector(HostNamespace(gwb), gwb.Spec.ClusterName)), tp.Backend.NodePort(tp.Port), tp.Service)
	case r.Insecure:
		tp.Message = "answers through the bridge (certificate not verified: insecureSkipTLSVerify)"
	case r.NameMissing:
		tp.Reason = guestnetv1.TLSNameMismatchReason
		tp.Message = fmt.Sprintf("its certificate carries %s but not %s, the name the guest apiserver verifies; add that name to the serving certificate",
			certNames(r), tp.TLSServerName)
		if tp.IsWebhook() {
			tp.Message += fmt.Sprintf(" (cert-manager's webhook: chart value webhook.url.host=%s, or its --dynamic-serving-dns-names flag)", tp.TLSServerName)
		}
	case !r.Verified:
		tp.Reason = guestnetv1.TLSUnverifiedReason
		tp.Message = "answers through the bridge, but " + r.Detail
	default:
		tp.Message = "answers through the bridge with a certificate valid for " + tp.TLSServerName
	}
}

func certNames(r ProbeResult) string {
	names := append(slices.Clone(r.DNSNames), r.IPs...)
	if len(names) == 0 {
		return "no names"
	}
	return "[" + strings.Join(names, " ") + "]"
}

// TargetStatuses is status.targets for the plan.
func TargetStatuses(p *Plan) []guestnetv1.TargetStatus {
	out := make([]guestnetv1.TargetStatus, 0, len(p.Targets))
	for i := range p.Targets {
		tp := &p.Targets[i]
		st := guestnetv1.TargetStatus{
			Kind:    tp.Kind,
			Name:    tp.Name,
			Webhook: tp.Webhook,
			Bridged: tp.Bridged,
			Message: Truncate(strings.Join(slices.DeleteFunc(append([]string{tp.Message}, tp.Warnings...), func(s string) bool { return s == "" }), "; "), guestnetv1.MaxTargetMessage),
		}
		if tp.Service != nil {
			st.GuestService = tp.Service.Namespace + "/" + tp.Service.Name
		}
		if tp.Backend != nil {
			st.NodePort = tp.Backend.NodePort(tp.Port)
			st.HostService = tp.Backend.HostService
			st.URL = tp.URL
			st.TLSServerName = tp.TLSServerName
		}
		if tp.Probe != nil {
			st.Reachable = ptr.To(tp.Probe.OK())
		}
		out = append(out, st)
	}
	return out
}

// Counts are status.bridgedTargets and status.totalTargets.
func Counts(p *Plan) (bridged, total int32) {
	for _, tp := range p.Targets {
		if tp.Bridged {
			bridged++
		}
	}
	return bridged, int32(len(p.Targets) + len(p.LeftOut))
}

// SetTargetsBridgedCondition reports whether every selected target is bridged or left alone
// for a reason that needs nothing from the user.
func SetTargetsBridgedCondition(gwb *guestnetv1.GuestWebhookBridge, p *Plan) {
	bridged, total := Counts(p)
	failing := failingTargets(p, bridgedReasons)
	switch {
	case len(p.LeftOut) > 0:
		var names []string
		for i, t := range p.LeftOut {
			if i == maxListed {
				names = append(names, fmt.Sprintf("and %d more", len(p.LeftOut)-maxListed))
				break
			}
			names = append(names, t.String())
		}
		msg := fmt.Sprintf("%d targets match the selection; guestnet handles at most %d (those it bridged first, then by kind and name) "+
			"and leaves the others untouched: left out: %s. Narrow the selection (names, or a selector)",
			total, guestnetv1.MaxTargets, strings.Join(names, ", "))
		if len(failing) > 0 {
			msg += fmt.Sprintf(". Of the others, %d not bridged: %s", len(failing), listTargets(failing))
		}
		set(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionFalse, guestnetv1.TooManyTargetsReason, msg)
	case len(failing) > 0:
		set(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionFalse, failing[0].Reason,
			fmt.Sprintf("%d of %d targets not bridged: %s", len(failing), total, listTargets(failing)))
	case total == 0:
		set(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.NoTargetsReason,
			"No guest APIService or webhook configuration matches the selection yet; guestnet bridges them once they appear")
	default:
		msg := fmt.Sprintf("%d of %d targets bridged", bridged, total)
		if left := total - bridged; left > 0 {
			msg += fmt.Sprintf("; %d left alone (see status.targets)", left)
		}
		set(gwb, guestnetv1.TargetsBridgedCondition, metav1.ConditionTrue, guestnetv1.TargetsBridgedReason, msg+warnings(p))
	}
}

// SetTargetsReachableCondition reports whether every target that goes through the bridge
// answers from the host network with a certificate the guest apiserver accepts.
func SetTargetsReachableCondition(gwb *guestnetv1.GuestWebhookBridge, p *Plan) {
	var probed int
	for _, tp := range p.Targets {
		if tp.Probe != nil {
			probed++
		}
	}
	failing := failingTargets(p, reachableReasons)
	switch {
	case len(failing) > 0:
		set(gwb, guestnetv1.TargetsReachableCondition, metav1.ConditionFalse, failing[0].Reason,
			fmt.Sprintf("%d of %d bridged targets cannot be called: %s", len(failing), probed, listTargets(failing)))
	case probed == 0:
		set(gwb, guestnetv1.TargetsReachableCondition, metav1.ConditionTrue, guestnetv1.NoTargetsReason,
			"No target goes through the bridge")
	default:
		set(gwb, guestnetv1.TargetsReachableCondition, metav1.ConditionTrue, guestnetv1.TargetsReachableReason,
			fmt.Sprintf("%d bridged targets answer from the host network, as the guest apiserver will call them", probed)+warnings(p))
	}
}

// failingTargets are the targets whose reason is one of reasons, ordered by reasons.
func failingTargets(p *Plan, reasons []string) []*TargetPlan {
	var out []*TargetPlan
	for _, reason := range reasons {
		for i := range p.Targets {
			if p.Targets[i].Reason == reason {
				out = append(out, &p.Targets[i])
			}
		}
		for i := range p.Restores {
			if p.Restores[i].Reason == reason {
				out = append(out, &p.Restores[i])
			}
		}
	}
	return out
}

// Truncate cuts s to at most n bytes (on a character boundary), marking the cut with "...".
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

func listTargets(ts []*TargetPlan) string {
	var parts []string
	for i, tp := range ts {
		if i == maxListed {
			parts = append(parts, fmt.Sprintf("and %d more (see status.targets)", len(ts)-maxListed))
			break
		}
		parts = append(parts, fmt.Sprintf("%s: %s", tp.Target, Truncate(tp.Message, maxListedMessage)))
	}
	return strings.Join(parts, "; ")
}

// warnings lists the targets' warnings for a condition message.
func warnings(p *Plan) string {
	var parts []string
	n := 0
	for _, tp := range p.Targets {
		for _, w := range tp.Warnings {
			if n < maxListed {
				parts = append(parts, fmt.Sprintf("%s: %s", tp.Target, w))
			}
			n++
		}
	}
	if n == 0 {
		return ""
	}
	if n > maxListed {
		parts = append(parts, fmt.Sprintf("and %d more (see status.targets)", n-maxListed))
	}
	return ". Warnings: " + strings.Join(parts, "; ")
}

func set(gwb *guestnetv1.GuestWebhookBridge, conditionType string, status metav1.ConditionStatus, reason, message string) {
	conditions.Set(gwb, metav1.Condition{Type: conditionType, Status: status, Reason: reason, Message: message})
}
