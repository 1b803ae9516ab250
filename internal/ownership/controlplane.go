package ownership

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// Marks of the pool and L2 policy guestnet creates for a GuestNodeIdentity's control plane
// address (they are cluster-scoped: no owner reference to a namespaced object holds).
const (
	// NodeIdentityNamespaceLabel and NodeIdentityNameLabel name the GuestNodeIdentity.
	NodeIdentityNamespaceLabel = "guestnet.addons.cluster.x-k8s.io/nodeidentity-namespace"
	NodeIdentityNameLabel      = "guestnet.addons.cluster.x-k8s.io/nodeidentity-name"
	// NodeIdentityAnnotation holds "<namespace>/<name>" of the GuestNodeIdentity exactly, and
	// NodeIdentityUIDAnnotation its UID.
	NodeIdentityAnnotation    = "guestnet.addons.cluster.x-k8s.io/nodeidentity"
	NodeIdentityUIDAnnotation = "guestnet.addons.cluster.x-k8s.io/nodeidentity-uid"
)

// ControlPlaneLabels are the labels of the host objects of gni's control plane address.
func ControlPlaneLabels(gni *guestnetv1.GuestNodeIdentity) map[string]string {
	return map[string]string{
		ManagedByLabel:             ManagedByValue,
		ClusterNameLabel:           gni.Spec.ClusterName,
		NodeIdentityNamespaceLabel: gni.Namespace,
		NodeIdentityNameLabel:      hostnames.LabelValue(gni.Name),
	}
}

// ControlPlaneAnnotations are their annotations: the GuestNodeIdentity exactly, its UID and
// the manager instance's mark.
func ControlPlaneAnnotations(gni *guestnetv1.GuestNodeIdentity) map[string]string {
	a := map[string]string{NodeIdentityAnnotation: gni.Namespace + "/" + gni.Name}
	if gni.UID != "" {
		a[NodeIdentityUIDAnnotation] = string(gni.UID)
	}
	if mark := InstanceMark(gni); mark != "" {
		a[WatchFilterAnnotation] = mark
	}
	return a
}

// IsControlPlaneObject reports whether obj, a pool or L2 policy, is one guestnet made for the
// control plane address of a GuestNodeIdentity of gni's namespace and name. Nothing else is
// ever changed or deleted for it.
func IsControlPlaneObject(obj metav1.Object, gni *guestnetv1.GuestNodeIdentity) bool {
	return labelOf(obj, ManagedByLabel) == ManagedByValue &&
		annotationOf(obj, NodeIdentityAnnotation) == gni.Namespace+"/"+gni.Name
}
