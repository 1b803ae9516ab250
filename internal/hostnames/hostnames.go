// Package hostnames is the one place that names, labels and recognises the host objects
// guestnet creates for a GuestIngress: the LoadBalancer Service in the Cluster's namespace,
// and the cluster-scoped CiliumLoadBalancerIPPool and CiliumL2AnnouncementPolicy.
//
// Names are readable (derived from the names of the Cluster, the GuestIngress and, for
// cluster-scoped objects, the namespace; never from UIDs) and stay within Kubernetes' limits.
// A hash suffix is added only when the readable name cannot be used as it is (too long, or
// characters a Service name cannot hold had to be replaced), so that two different inputs
// never end on the same name.
package hostnames

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// Limits of the names involved.
const (
	// MaxServiceName: a Service name is a DNS-1035 label.
	MaxServiceName = 63
	// MaxObjectName: a custom resource name is a DNS-1123 subdomain.
	MaxObjectName = 253
	// MaxLabelValue: a label value.
	MaxLabelValue = 63

	hashLength = 10
)

// FieldManager is guestnet's server-side apply field manager, on the host and in the guest.
const FieldManager = "guestnet"

// Labels on every host object guestnet creates for a GuestIngress. Label values are
// LabelValue()s; the exact GuestIngress is in GuestIngressAnnotation.
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
)

// HostService names the host LoadBalancer Service of gi, in gi's namespace: "<cluster>-<gi>",
// e.g. "tenant-a-web".
func HostService(gi *guestnetv1.GuestIngress) string {
	return ServiceName(gi.Spec.ClusterName + "-" + gi.Name)
}

// Pool names the CiliumLoadBalancerIPPool guestnet creates for gi: "<namespace>.<cluster>-<gi>",
// e.g. "k0smotron.tenant-a-web". Pools are cluster-scoped: the namespace, which cannot hold a
// '.', comes first, so two namespaces never share a name.
func Pool(gi *guestnetv1.GuestIngress) string {
	return ObjectName(gi.Namespace + "." + gi.Spec.ClusterName + "-" + gi.Name)
}

// L2Policy names the CiliumL2AnnouncementPolicy guestnet creates for gi; like Pool.
func L2Policy(gi *guestnetv1.GuestIngress) string {
	return Pool(gi)
}

// ServiceName turns base into a DNS-1035 label (lower case, starts with a letter, no '.',
// at most 63 characters). base is returned unchanged when it is one already; otherwise the
// result ends with a hash of base.
func ServiceName(base string) string {
	name := strings.ReplaceAll(base, ".", "-")
	if name != "" && (name[0] < 'a' || name[0] > 'z') {
		name = "gi-" + name
	}
	if name == base && len(name) <= MaxServiceName {
		return name
	}
	return withHash(name, base, MaxServiceName)
}

// ObjectName shortens base to a DNS-1123 subdomain's 253 characters, with a hash of base
// when it had to be cut.
func ObjectName(base string) string {
	if len(base) <= MaxObjectName {
		return base
	}
	return withHash(base, base, MaxObjectName)
}

// LabelValue shortens value to a label value's 63 characters, with a hash of value when it
// had to be cut.
func LabelValue(value string) string {
	if len(value) <= MaxLabelValue {
		return value
	}
	return withHash(value, value, MaxLabelValue)
}

// withHash cuts name so that "-<hash of base>" fits in limit, and appends it.
func withHash(name, base string, limit int) string {
	sum := sha256.Sum256([]byte(base))
	suffix := hex.EncodeToString(sum[:])[:hashLength]
	keep := min(len(name), limit-hashLength-1)
	prefix := strings.TrimRight(name[:keep], "-.")
	return prefix + "-" + suffix
}

// Labels are the labels guestnet puts on every host object of gi; they win over the user's
// spec.loadBalancer.labels of the same keys.
func Labels(gi *guestnetv1.GuestIngress) map[string]string {
	return map[string]string{
		ManagedByLabel:             ManagedByValue,
		ClusterNameLabel:           gi.Spec.ClusterName,
		GuestIngressNamespaceLabel: gi.Namespace,
		GuestIngressNameLabel:      LabelValue(gi.Name),
		GuestServiceNamespaceLabel: gi.Spec.GuestService.Namespace,
		GuestServiceNameLabel:      gi.Spec.GuestService.Name,
	}
}

// Annotations are the annotations guestnet puts on its cluster-scoped host objects of gi.
func Annotations(gi *guestnetv1.GuestIngress) map[string]string {
	return map[string]string{GuestIngressAnnotation: gi.Namespace + "/" + gi.Name}
}

// SelectGuestIngress is the label selector of every host object of gi.
func SelectGuestIngress(gi *guestnetv1.GuestIngress) map[string]string {
	return map[string]string{
		ManagedByLabel:             ManagedByValue,
		GuestIngressNamespaceLabel: gi.Namespace,
		GuestIngressNameLabel:      LabelValue(gi.Name),
	}
}

// IsOwnedBy reports whether obj is a host object guestnet created for gi: a Service whose
// controller is gi, or a pool or policy labelled and annotated for gi. Nothing else is ever
// changed or deleted by guestnet.
func IsOwnedBy(obj metav1.Object, gi *guestnetv1.GuestIngress) bool {
	if ref := metav1.GetControllerOfNoCopy(obj); ref != nil {
		return ref.Kind == "GuestIngress" && ref.Name == gi.Name &&
			(gi.UID == "" || ref.UID == gi.UID) && obj.GetNamespace() == gi.Namespace
	}
	return obj.GetLabels()[ManagedByLabel] == ManagedByValue &&
		obj.GetAnnotations()[GuestIngressAnnotation] == gi.Namespace+"/"+gi.Name
}

// GuestIngressOf returns the GuestIngress a host object belongs to, from its controller
// owner reference (Services) or its annotation (pools, policies); ok is false for objects
// guestnet did not create.
func GuestIngressOf(obj metav1.Object) (types.NamespacedName, bool) {
	if obj.GetLabels()[ManagedByLabel] != ManagedByValue {
		return types.NamespacedName{}, false
	}
	if ref := metav1.GetControllerOfNoCopy(obj); ref != nil && ref.Kind == "GuestIngress" && obj.GetNamespace() != "" {
		return types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}, true
	}
	ns, name, ok := strings.Cut(obj.GetAnnotations()[GuestIngressAnnotation], "/")
	if !ok || ns == "" || name == "" {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: name}, true
}
