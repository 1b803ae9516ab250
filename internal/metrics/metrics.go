// Package metrics holds guestnet's own Prometheus metrics, all named guestnet_*, on
// controller-runtime's registry (served with controller-runtime's on the manager's
// --diagnostics-address). docs/metrics.md describes each one; a test checks that it lists
// exactly the metrics registered here.
//
// Cardinality is bounded: every label takes its values from a fixed set (condition reasons,
// the kinds below), never an object's name or namespace.
//
// Two kinds of metrics:
//   - counters of things guestnet did (repairs, rollouts) or refused (conflicts, policy
//     refusals), incremented where it happens;
//   - gauges of the current state (GuestIngresses by Ready reason, bridge targets, guest
//     clusters unreachable), computed on every scrape from the manager's cache by Collector.
//     A gauge set on reconcile would have to be taken back when the object is deleted, and
//     one missed deletion (a restart, a finalizer removed by hand) would leave it wrong
//     forever; listing the cache on scrape cannot drift.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Metric names (docs/metrics.md lists them).
const (
	RepairsName           = "guestnet_repairs_total"
	WorkerRolloutsName    = "guestnet_worker_rollouts_total"
	ConflictsRefusedName  = "guestnet_conflicts_refused_total"
	PolicyRefusalsName    = "guestnet_policy_refusals_total"
	GuestIngressesName    = "guestnet_guestingresses"
	BridgeTargetsName     = "guestnet_bridge_targets"
	GuestsUnreachableName = "guestnet_guest_clusters_unreachable"
)

// RepairKind is what guestnet wrote again because someone else changed or deleted it.
type RepairKind string

// The kinds of repairs (label kind of guestnet_repairs_total).
const (
	// RepairHostService: a GuestIngress's host LoadBalancer Service.
	RepairHostService RepairKind = "HostService"
	// RepairPool: a GuestIngress's CiliumLoadBalancerIPPool.
	RepairPool RepairKind = "Pool"
	// RepairL2Policy: a GuestIngress's CiliumL2AnnouncementPolicy.
	RepairL2Policy RepairKind = "L2Policy"
	// RepairAnnouncer: a GuestIngress's CiliumBGPAdvertisement, or its MetalLB IPAddressPool,
	// L2Advertisement or BGPAdvertisement.
	RepairAnnouncer RepairKind = "Announcer"
	// RepairGuestService: the guest ingress controller's Service (type, fixed nodePorts),
	// e.g. after a reinstall of the ingress controller's chart.
	RepairGuestService RepairKind = "GuestService"
	// RepairBridgeHostService and RepairBridgeGuestService: a GuestWebhookBridge's host
	// ClusterIP Service and its guest NodePort/ExternalName Services.
	RepairBridgeHostService  RepairKind = "BridgeHostService"
	RepairBridgeGuestService RepairKind = "BridgeGuestService"
	// RepairAPIService, RepairMutatingWebhook and RepairValidatingWebhook: a bridged target
	// that no longer pointed at the bridge (Helm, a GitOps tool or cainjector reverted it).
	RepairAPIService        RepairKind = "APIService"
	RepairMutatingWebhook   RepairKind = "MutatingWebhookConfiguration"
	RepairValidatingWebhook RepairKind = "ValidatingWebhookConfiguration"
	// RepairBridgeRecord: the record of a target's original on the guest object, rewritten
	// from the bridge's host copy (the annotation was removed or damaged).
	RepairBridgeRecord RepairKind = "BridgeRecord"
)

// RepairKinds are all the values of label kind of guestnet_repairs_total.
var RepairKinds = []RepairKind{
	RepairHostService, RepairPool, RepairL2Policy, RepairAnnouncer, RepairGuestService,
	RepairBridgeHostService, RepairBridgeGuestService,
	RepairAPIService, RepairMutatingWebhook, RepairValidatingWebhook, RepairBridgeRecord,
}

// RepairKindOfTarget is the repair kind of a bridged target of that kind.
func RepairKindOfTarget(kind guestnetv1.TargetKind) RepairKind {
	switch kind {
	case guestnetv1.APIServiceTarget:
		return RepairAPIService
	case guestnetv1.MutatingWebhookTarget:
		return RepairMutatingWebhook
	default:
		return RepairValidatingWebhook
	}
}

// ConflictReasons are the condition reasons with which guestnet refuses to take something
// another object holds: the values of label reason of guestnet_conflicts_refused_total.
var ConflictReasons = []string{
	guestnetv1.IPConflictReason,
	guestnetv1.PoolConflictReason,
	guestnetv1.HostObjectConflictReason,
	guestnetv1.NodePortConflictReason,
	guestnetv1.TargetClaimedReason,
}

// PolicyRefusalReasons are the reasons of Admitted=False on a GuestIngress: the values of
// label reason of guestnet_policy_refusals_total.
var PolicyRefusalReasons = []string{
	guestnetv1.NoPolicyReason,
	guestnetv1.NotAllowedReason,
	guestnetv1.QuotaExceededReason,
	guestnetv1.HostAddressReason,
	guestnetv1.SharedPoolNotFoundReason,
	guestnetv1.SharedPoolUnsafeReason,
}

var (
	repairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: RepairsName,
		Help: "Writes guestnet made to put back an object it manages that someone else changed or deleted, by kind of object.",
	}, []string{"kind"})
	workerRollouts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: WorkerRolloutsName,
		Help: "Worker MachineDeployments guestnet repointed at a template that declares more ports, each starting a rollout.",
	})
	conflictsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: ConflictsRefusedName,
		Help: "Times a GuestIngress or GuestWebhookBridge entered a condition refusing what another object holds, by reason.",
	}, []string{"reason"})
	policyRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: PolicyRefusalsName,
		Help: "Times a GuestIngress became not admitted by the GuestIngressPolicies (Admitted=False), by reason.",
	}, []string{"reason"})
)

func init() {
	ctrlmetrics.Registry.MustRegister(repairs, workerRollouts, conflictsRefused, policyRefusals)
	// Every series exists from the start at 0: rate() and increase() then see the first
	// increment, and a dashboard shows 0 rather than nothing.
	for _, k := range RepairKinds {
		repairs.WithLabelValues(string(k))
	}
	for _, r := range ConflictReasons {
		conflictsRefused.WithLabelValues(r)
	}
	for _, r := range PolicyRefusalReasons {
		policyRefusals.WithLabelValues(r)
	}
}

// Repaired counts a repair of that kind.
func Repaired(kind RepairKind) {
	repairs.WithLabelValues(string(kind)).Inc()
}

// WorkerRolloutTriggered counts a MachineDeployment guestnet repointed.
func WorkerRolloutTriggered() {
	workerRollouts.Inc()
}

// ConditionChanged counts a condition that changed (newly set, or to another status or
// reason) to status and reason: conflicts and policy refusals are counted once when an object
// enters that state, not on every reconcile that finds it still there. Other conditions and
// reasons are ignored (a reason outside the fixed sets would be a new label value).
func ConditionChanged(conditionType, status, reason string) {
	if status != "False" {
		return
	}
	switch {
	case conditionType == guestnetv1.AdmittedCondition && contains(PolicyRefusalReasons, reason):
		policyRefusals.WithLabelValues(reason).Inc()
	case conditionType != guestnetv1.ReadyCondition && contains(ConflictReasons, reason):
		// Ready repeats the reason of the condition it summarises: counted there only.
		conflictsRefused.WithLabelValues(reason).Inc()
	}
}

func contains(values []string, v string) bool {
	for _, x := range values {
		if x == v {
			return true
		}
	}
	return false
}
