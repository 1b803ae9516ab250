// Package ownership is how guestnet marks the objects it creates and recognises them as its
// own: the labels and annotations it puts on them (the manager caches only Services and
// EndpointSlices labelled ManagedByLabel), the owner checks done before anything is changed or
// deleted, and FieldManager, the server-side apply field manager. The objects' names are
// internal/hostnames.
package ownership

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// FieldManager is guestnet's server-side apply field manager, on the host and in the guest.
const FieldManager = "guestnet"

// Labels on every host object guestnet creates for a GuestIngress. Label values are
// hostnames.LabelValue()s; the exact GuestIngress is in GuestIngressAnnotation.
const (
	// ManagedByLabel (with ManagedByValue) marks host objects guestnet created. Its manager
	// caches only the Services and EndpointSlices that carry it (the EndpointSlice controller
	// copies a Service's labels to its slices).
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "guestnet"
	// ClusterNameLabel names the CAPI Cluster the object exposes (CAPI's own label).
	ClusterNameLabel = "cluster.x-k8s.io/cluster-name"
	// GuestIngressNamespaceLabel and GuestIngressNameLabel name the GuestIngress the object
	// belongs to. Pools and policies are cluster-scoped and cannot carry an owner reference
	// to a namespaced GuestIngress that the garbage collector honours, so these (with the
	// GuestIngress's finalizer) are how guestnet finds and deletes them.
	GuestIngressNamespaceLabel = "guestnet.addons.cluster.x-k8s.io/guestingress-namespace"
	GuestIngressNameLabel      = "guestnet.addons.cluster.x-k8s.io/guestingress-name"
	// GuestServiceNamespaceLabel and GuestServiceNameLabel name the guest Service the
	// traffic ends at (traceability: `kubectl get svc -l ...` in the host).
	GuestServiceNamespaceLabel = "guestnet.addons.cluster.x-k8s.io/guest-service-namespace"
	GuestServiceNameLabel      = "guestnet.addons.cluster.x-k8s.io/guest-service-name"

	// GuestIngressAnnotation holds "<namespace>/<name>" of the GuestIngress, exactly (label
	// values may be shortened).
	GuestIngressAnnotation = "guestnet.addons.cluster.x-k8s.io/guestingress"
	// GuestIngressUIDAnnotation holds the UID of the GuestIngress a pool or L2 policy was
	// made for: a GuestIngress deleted and created again under the same name is another
	// one, and what was made for the first is an orphan (docs/decisions/0008).
	GuestIngressUIDAnnotation = "guestnet.addons.cluster.x-k8s.io/guestingress-uid"
	// WatchFilterAnnotation holds the watch-filter value (cluster.x-k8s.io/watch-filter) of
	// the manager instance that made a host object, so that each instance sweeps only its
	// own orphans. Absent when the GuestIngress carried no watch-filter label.
	WatchFilterAnnotation = "guestnet.addons.cluster.x-k8s.io/watch-filter"
)

// Labels are the labels guestnet puts on every host object of gi; they win over the user's
// spec.loadBalancer.labels of the same keys.
func Labels(gi *guestnetv1.GuestIngress) map[string]string {
	return map[string]string{
		ManagedByLabel:             ManagedByValue,
		ClusterNameLabel:           gi.Spec.ClusterName,
		GuestIngressNamespaceLabel: gi.Namespace,
		GuestIngressNameLabel:      hostnames.LabelValue(gi.Name),
		GuestServiceNamespaceLabel: gi.Spec.GuestService.Namespace,
		GuestServiceNameLabel:      gi.Spec.GuestService.Name,
	}
}

// Annotations are the annotations guestnet puts on its cluster-scoped host objects of gi:
// the GuestIngress exactly, its UID and the instance's mark (InstanceMark).
func Annotations(gi *guestnetv1.GuestIngress) map[string]string {
	a := map[string]string{GuestIngressAnnotation: gi.Namespace + "/" + gi.Name}
	if gi.UID != "" {
		a[GuestIngressUIDAnnotation] = string(gi.UID)
	}
	if mark := InstanceMark(gi); mark != "" {
		a[WatchFilterAnnotation] = mark
	}
	return a
}

// InstanceMark is the mark of the manager instance that reconciles gi, as its host objects
// carry it (WatchFilterAnnotation): gi's own cluster.x-k8s.io/watch-filter label. An instance
// with a watch filter reconciles only GuestIngresses labelled with its value, so the label is
// that value; an instance without one reconciles everything and sweeps every mark.
func InstanceMark(gi metav1.Object) string {
	return labelOf(gi, clusterv1.WatchLabel)
}

// MadeByInstance reports whether obj, a host object of guestnet's, was made by the manager
// instance with this watch-filter value: its WatchFilterAnnotation is that value. An instance
// without a watch filter (value "") made, and sweeps, all of them.
func MadeByInstance(obj metav1.Object, watchFilterValue string) bool {
	return watchFilterValue == "" || annotationOf(obj, WatchFilterAnnotation) == watchFilterValue
}

// MadeForUID is the UID of the GuestIngress obj was made for: a host Service's controller
// owner reference's, a pool's or L2 policy's GuestIngressUIDAnnotation. Empty for an object
// made before guestnet recorded it (adopted by the GuestIngress of its name, IsOwnedBy).
func MadeForUID(obj metav1.Object) types.UID {
	if ref := metav1.GetControllerOfNoCopy(obj); ref != nil && ref.Kind == "GuestIngress" {
		return ref.UID
	}
	return types.UID(annotationOf(obj, GuestIngressUIDAnnotation))
}

// Orphaned reports whether obj, a host object made for a GuestIngress of live's key, is an
// orphan for the manager instance with this watch-filter value: the GuestIngress is gone
// (live is nil), is no longer this instance's (its watch-filter label changed), or is another
// one than obj was made for (another UID). An object made before guestnet recorded UIDs is
// the GuestIngress's of its name (adopted, not an orphan) while that one exists.
func Orphaned(obj metav1.Object, live *guestnetv1.GuestIngress, watchFilterValue string) bool {
	if live == nil || (watchFilterValue != "" && InstanceMark(live) != watchFilterValue) {
		return true
	}
	uid := MadeForUID(obj)
	return uid != "" && live.UID != "" && uid != live.UID
}

// NeedsMarks reports whether a pool or L2 policy of gi lacks the marks guestnet puts on
// them now (the UID, the instance's mark): one made by an older guestnet, adopted by
// writing them.
func NeedsMarks(obj metav1.Object, gi *guestnetv1.GuestIngress) bool {
	for k, v := range Annotations(gi) {
		if annotationOf(obj, k) != v {
			return true
		}
	}
	return false
}

// SelectGuestIngress is the label selector of every host object of gi.
func SelectGuestIngress(gi *guestnetv1.GuestIngress) map[string]string {
	return map[string]string{
		ManagedByLabel:             ManagedByValue,
		GuestIngressNamespaceLabel: gi.Namespace,
		GuestIngressNameLabel:      hostnames.LabelValue(gi.Name),
	}
}

// IsOwnedBy reports whether obj is a host object guestnet created for gi, UID-exact: a
// Service whose controller is gi, or a pool or policy labelled and annotated for gi and
// made for its UID (or made before guestnet recorded UIDs: adopted). An object made for
// another GuestIngress of the same name, deleted since, is not gi's: it is an orphan for the
// sweep. Nothing else is ever changed or deleted by guestnet.
func IsOwnedBy(obj metav1.Object, gi *guestnetv1.GuestIngress) bool {
	if ref := metav1.GetControllerOfNoCopy(obj); ref != nil {
		return ref.Kind == "GuestIngress" && ref.Name == gi.Name &&
			(gi.UID == "" || ref.UID == gi.UID) && obj.GetNamespace() == gi.Namespace
	}
	uid := annotationOf(obj, GuestIngressUIDAnnotation)
	return labelOf(obj, ManagedByLabel) == ManagedByValue &&
		annotationOf(obj, GuestIngressAnnotation) == gi.Namespace+"/"+gi.Name &&
		(uid == "" || gi.UID == "" || types.UID(uid) == gi.UID)
}

// GuestIngressOf returns the GuestIngress a host object belongs to, from its controller
// owner reference (Services) or its annotation (pools, policies); ok is false for objects
// guestnet did not create.
func GuestIngressOf(obj metav1.Object) (types.NamespacedName, bool) {
	if labelOf(obj, ManagedByLabel) != ManagedByValue {
		return types.NamespacedName{}, false
	}
	if ref := metav1.GetControllerOfNoCopy(obj); ref != nil && ref.Kind == "GuestIngress" && obj.GetNamespace() != "" {
		return types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}, true
	}
	ns, name, ok := strings.Cut(annotationOf(obj, GuestIngressAnnotation), "/")
	if !ok || ns == "" || name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: name}, true
}

// labelOf and annotationOf read one label or annotation of obj. An Unstructured's GetLabels
// and GetAnnotations copy its maps on every call, and every GuestIngress reconcile asks whose
// each pool and L2 policy of the host is (docs/performance.md).
func labelOf(obj metav1.Object, key string) string {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return metadataEntry(u, "labels", key)
	}
	return obj.GetLabels()[key]
}

func annotationOf(obj metav1.Object, key string) string {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return metadataEntry(u, "annotations", key)
	}
	return obj.GetAnnotations()[key]
}

func metadataEntry(u *unstructured.Unstructured, field, key string) string {
	v, _, _ := unstructured.NestedFieldNoCopy(u.Object, "metadata", field, key)
	s, _ := v.(string)
	return s
}
