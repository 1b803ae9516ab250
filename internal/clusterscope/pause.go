package clusterscope

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/kubeconfig"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/status"
)

// SetPausedCondition sets Paused on obj and reports whether obj is paused. CAPI pause is the
// cluster.x-k8s.io/paused annotation on obj or on its Cluster, or Cluster spec.paused;
// clusterctl move relies on it, so a paused object must not be changed in any other way.
func SetPausedCondition(obj Object, cluster *clusterv1.Cluster) bool {
	reasons := pauseReasons(obj, cluster)
	if len(reasons) == 0 {
		conditions.Set(obj, metav1.Condition{
			Type:   guestnetv1.PausedCondition,
			Status: metav1.ConditionFalse,
			Reason: guestnetv1.NotPausedReason,
		})
		return false
	}
	conditions.Set(obj, metav1.Condition{
		Type:    guestnetv1.PausedCondition,
		Status:  metav1.ConditionTrue,
		Reason:  guestnetv1.PausedReason,
		Message: strings.Join(reasons, "; ") + ". guestnet makes no new changes until the pause is lifted",
	})
	return true
}

// IsPaused reports whether CAPI pause applies to obj (see SetPausedCondition).
func IsPaused(obj metav1.Object, cluster *clusterv1.Cluster) bool {
	return len(pauseReasons(obj, cluster)) > 0
}

func pauseReasons(obj metav1.Object, cluster *clusterv1.Cluster) []string {
	var reasons []string
	if annotations.HasPaused(obj) {
		reasons = append(reasons, "This object has the "+clusterv1.PausedAnnotation+" annotation")
	}
	if cluster != nil {
		if ptr.Deref(cluster.Spec.Paused, false) {
			reasons = append(reasons, fmt.Sprintf("Cluster %s has spec.paused set to true", cluster.Name))
		}
		if annotations.HasPaused(cluster) {
			reasons = append(reasons, fmt.Sprintf("Cluster %s has the %s annotation", cluster.Name, clusterv1.PausedAnnotation))
		}
	}
	return reasons
}

// KeepsReport reports whether obj keeps what it reported of its guest: the ClusterCache has
// not tried to connect yet (NotTriedYet) and obj has reported ClusterAvailable before. A new
// object reports the guest not connected.
func KeepsReport(obj Object, guestErr error) bool {
	return NotTriedYet(guestErr) && conditions.Has(obj, guestnetv1.ClusterAvailableCondition)
}

// SetClusterAvailableCondition sets ClusterAvailable on obj from its Cluster (nil when it
// does not exist) and the error, if any, of getting a client for the guest apiserver.
func SetClusterAvailableCondition(obj Object, cluster *clusterv1.Cluster, guestErr error) {
	if KeepsReport(obj, guestErr) {
		return // what the last try found stands until this manager's first
	}
	clusterName := ClusterNameOf(obj)
	condition := metav1.Condition{Type: guestnetv1.ClusterAvailableCondition, Status: metav1.ConditionFalse}
	switch {
	case cluster == nil:
		condition.Reason = guestnetv1.ClusterNotFoundReason
		condition.Message = fmt.Sprintf("No Cluster %q exists in namespace %q: create it, or recreate this object "+
			"with spec.clusterName naming an existing Cluster of this namespace", clusterName, obj.GetNamespace())
	case !cluster.DeletionTimestamp.IsZero():
		condition.Reason = guestnetv1.GuestGoneReason
		condition.Message = fmt.Sprintf("Cluster %s is being deleted: its guest goes with it, and guestnet keeps nothing on the host for it", cluster.Name)
	case !IsProvisioned(cluster):
		condition.Reason = guestnetv1.ClusterNotProvisionedReason
		condition.Message = fmt.Sprintf("Waiting for Cluster %s to be provisioned (status.initialization.infrastructureProvisioned "+
			"is not true); if it stays so, check the Cluster's conditions", cluster.Name)
	case isKubeconfigRefused(guestErr):
		refused, _ := kubeconfig.AsRefused(guestErr)
		condition.Reason = guestnetv1.KubeconfigRefusedReason
		condition.Message = status.Bound(fmt.Sprintf("guestnet does not connect to the apiserver of Cluster %s: %v. "+
			"Once the Secret is corrected, guestnet connects within 30 s", cluster.Name, refused), maxRefusalMessage)
	case IsGuestTooLarge(guestErr):
		condition.Reason = guestnetv1.GuestTooLargeReason
		condition.Message = fmt.Sprintf("The guest of Cluster %s is not cached: %v", cluster.Name, guestErr)
	case guestErr != nil:
		condition.Reason = guestnetv1.GuestUnreachableReason
		condition.Message = fmt.Sprintf("Cannot reach the apiserver of Cluster %s through the Secret %s-kubeconfig: %v. "+
			"guestnet retries; if this persists, check that the guest control plane runs and the Secret is current",
			cluster.Name, cluster.Name, guestErr)
	default:
		condition.Status = metav1.ConditionTrue
		condition.Reason = guestnetv1.ClusterAvailableReason
	}
	conditions.Set(obj, condition)
}

// maxRefusalMessage bounds the ClusterAvailable message of a refused kubeconfig (it lists
// every refused field).
const maxRefusalMessage = 4096

func isKubeconfigRefused(err error) bool {
	_, refused := kubeconfig.AsRefused(err)
	return refused
}
