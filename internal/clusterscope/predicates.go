package clusterscope

import (
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
)

// ClusterChanged passes the Cluster events that change what a guestnet object reports or may
// do: creation and deletion (ClusterAvailable), pause transitions of spec.paused or of the
// paused annotation (Paused), infrastructureProvisioned transitions (ClusterAvailable), and the
// start of its deletion (its guest is then gone for good: clusterscope.GuestGone).
// Every other Cluster update (status churn mostly) is dropped.
func ClusterChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool {
			oldCluster, okOld := e.ObjectOld.(*clusterv1.Cluster)
			newCluster, okNew := e.ObjectNew.(*clusterv1.Cluster)
			if !okOld || !okNew {
				return false
			}
			return ptr.Deref(oldCluster.Spec.Paused, false) != ptr.Deref(newCluster.Spec.Paused, false) ||
				annotations.HasPaused(oldCluster) != annotations.HasPaused(newCluster) ||
				IsProvisioned(oldCluster) != IsProvisioned(newCluster) ||
				oldCluster.DeletionTimestamp.IsZero() != newCluster.DeletionTimestamp.IsZero()
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// Changed passes creations, deletions and the updates that change an object (a new
// resourceVersion), not a resync's. A controller's watches other than For use it: the
// resync of For reconciles each object once, and the resync of what is mapped to it would
// only add reconciles, the fleet's worth for a watch that maps to many (docs/performance.md).
var Changed = predicate.ResourceVersionChangedPredicate{}
