package guestingress

import (
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/clusterscope"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
)

// updateStatus derives the status from what this reconcile observed, planned and did (the
// scope), in one place, as CAPI's MachineDeployment controller does: every field and
// condition is set anew, so a reconcile that stopped early leaves nothing of an earlier one
// behind. Called from the deferred patch, whatever the reconcile returned.
func updateStatus(s *scope) {
	gi := s.guestIngress
	if !gi.DeletionTimestamp.IsZero() {
		if s.hostDeleted {
			gi.Status.LoadBalancerIP, gi.Status.HostService, gi.Status.ReadyEndpoints = "", "", 0
		}
		if s.guestErr != nil {
			clusterscope.SetClusterAvailableCondition(gi, s.cluster, s.guestErr)
		}
		status.SetDeletingCondition(gi, deletingMessage(s))
		return
	}
	if s.ciliumMissing != "" {
		setCiliumMissingCondition(gi, s.ciliumMissing)
		return
	}
	if s.observed != nil || s.err != nil {
		// (A reconcile that only stored the finalizer observed nothing: the next one reports.)
		clusterscope.SetClusterAvailableCondition(gi, s.cluster, s.guestErr)
	}
	summarised := ingress.SummarisedConditions
	if s.observed != nil && s.plan != nil && s.result != nil {
		summarised = ingress.SetStatus(gi, s.observed, s.plan, s.result)
	}
	if s.err != nil {
		// The reconcile failed before it could finish (it is retried with backoff): say so
		// rather than leave what an earlier one found.
		conditions.Set(gi, metav1.Condition{
			Type: guestnetv1.LoadBalancerReadyCondition, Status: metav1.ConditionUnknown, Reason: guestnetv1.InternalErrorReason,
			Message: status.Bound(fmt.Sprintf("guestnet could not finish this reconcile and retries: %v", s.err), ingress.MaxMessage),
		})
		if !slices.Contains(summarised, guestnetv1.LoadBalancerReadyCondition) {
			summarised = append(slices.Clone(summarised), guestnetv1.LoadBalancerReadyCondition)
		}
	}
	status.SetReadyCondition(gi, summarised...)
}

// updatePausedStatus derives what a paused reconcile decided: Admitted (status is derived
// even when paused, so that a revocation shows), and, when the GuestIngress is not admitted,
// no chain to report on (as updateStatus reports a withdrawal), with Ready saying why. When
// reconcileHeld took off the host Service, the status says so. Everything else stays as the
// last reconcile that could act left it, Ready included, unless the GuestIngress was not
// admitted then and is now: there is no chain yet, and Ready no longer names Admitted.
func updatePausedStatus(s *scope) {
	gi, o := s.guestIngress, s.host
	if o == nil {
		return // Cilium is not installed, or the host could not be read: only Paused
	}
	wasRefused := conditions.IsFalse(gi, guestnetv1.AdmittedCondition)
	ingress.SetAdmitted(gi, o.Admission)
	if o.HostService == nil && gi.Status.HostService != "" {
		gi.Status.LoadBalancerIP, gi.Status.HostService, gi.Status.ReadyEndpoints = "", "", 0
		if o.Admission.Admitted {
			ingress.SetNoHostService(gi)
		}
	}
	switch {
	case !o.Admission.Admitted:
		for _, c := range ingress.ExposureConditions {
			conditions.Delete(gi, c)
		}
		status.SetReadyCondition(gi, guestnetv1.AdmittedCondition, guestnetv1.ClusterAvailableCondition)
	case wasRefused || s.revoked:
		status.SetReadyCondition(gi, ingress.SummarisedConditions...)
	}
}

// deletingMessage says what a deletion waits for.
func deletingMessage(s *scope) string {
	gi := s.guestIngress
	if !s.waitingForGuest {
		return "Being deleted: guestnet is undoing what it did for this object"
	}
	return fmt.Sprintf("Being deleted: the host objects are gone; waiting for the guest apiserver of Cluster %s to give Service %s/%s back "+
		"(ClusterAvailable says why it cannot be reached). To give up on the guest, annotate this GuestIngress with %s=true: guestnet then "+
		"releases it and records in an event what it left in the guest", gi.Spec.ClusterName, gi.Spec.GuestService.Namespace, gi.Spec.GuestService.Name,
		guestnetv1.SkipGuestCleanupAnnotation)
}

// setCiliumMissingCondition reports that the host serves no Cilium LB-IPAM (message, from
// the gate): LoadBalancerReady and Ready are False with CiliumLBIPAMNotInstalled. The other
// conditions stay as the last reconcile that could observe left them.
func setCiliumMissingCondition(gi *guestnetv1.GuestIngress, message string) {
	conditions.Set(gi, metav1.Condition{
		Type: guestnetv1.LoadBalancerReadyCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.CiliumLBIPAMNotInstalledReason,
		Message: status.Bound(message+". Nothing is created on the host for this GuestIngress until then", ingress.MaxMessage),
	})
	status.SetReadyCondition(gi, guestnetv1.LoadBalancerReadyCondition)
}
