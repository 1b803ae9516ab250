package manager

import (
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/nodeidentity"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ports"
)

// guestnetPrefix is the prefix of every annotation and label key guestnet writes or reads on
// guest objects (its records: guestnetv1.OriginalGuestServiceAnnotation,
// guestnetv1.BridgeOriginalAnnotation; its marks: ownership.BridgeAnnotation and the bridge
// labels).
const guestnetPrefix = "guestnet.addons.cluster.x-k8s.io/"

// DroppedAnnotationsKey replaces, in the guest caches, every annotation guestnet does not
// read; its value is how many there were. It stands in for them so that "the object has other
// annotations" stays true in the cache: the bridge's JSON patches add or remove the whole
// annotations map only when the record is the object's only annotation
// (internal/bridge.GuestPatch). It is never written to an object.
const DroppedAnnotationsKey = guestnetPrefix + "cache-dropped-annotations"

// KeepWhatGuestnetReads is the transform of every object in the guest caches (Services,
// webhook configurations, APIServices; docs/decisions/0009-bounded-guests.md). A tenant
// controls every byte of its guest's objects, and each cached byte is the shared manager's
// memory: it keeps only what internal/ingress, internal/bridge and internal/ports read.
//   - managedFields: guestnet's own server-side apply entries only (KeepOwnManagedFields);
//   - annotations: guestnet's own only; the others are replaced by one DroppedAnnotationsKey
//     entry (kubectl's last-applied-configuration, Helm's, any large value a tenant writes);
//   - labels of Services: guestnet's own and app.kubernetes.io/managed-by only. guestnet never
//     selects guest Services by any other label (a bridge names them, a GuestIngress names
//     one). Webhook configurations and APIServices keep their labels: a bridge's spec selects
//     them by label;
//   - Nodes (node identity): only their name, providerID, taints, addresses and who wrote the
//     addresses (nodeidentity.TrimNode); DaemonSets: no spec.
//
// Specs and statuses are kept as they are: guestnet reads them (ports, selectors, client
// configs and their caBundles, APIService conditions). No cached guest object is ever written
// back whole (guestnet writes guest objects with server-side apply of configurations it
// builds and JSON patches of its own fields), so what the cache drops is never lost.
func KeepWhatGuestnetReads(in any) (any, error) {
	switch o := in.(type) {
	case *corev1.Node:
		return nodeidentity.TrimNode(o), nil
	case *appsv1.DaemonSet:
		// guestnet reads its agent's DaemonSet for its status and its guestnet annotations
		// (which template it applied); never the pod template of anyone's DaemonSet.
		o.Spec = appsv1.DaemonSetSpec{}
	case *corev1.ConfigMap:
		// The one ConfigMap cached is cilium-config (SetupClusterCache): its tunnel entries.
		o.Data, o.BinaryData = ports.KeepTunnelKeys(o.Data), nil
	}
	if _, err := KeepOwnManagedFields(in); err != nil {
		return in, err
	}
	obj, err := meta.Accessor(in)
	if err != nil {
		return in, nil //nolint:nilerr // not an object (e.g. a tombstone): nothing to strip
	}
	obj.SetAnnotations(keepGuestnetAnnotations(obj.GetAnnotations()))
	if _, isService := in.(*corev1.Service); isService {
		obj.SetLabels(keepGuestnetLabels(obj.GetLabels()))
	}
	return in, nil
}

// keepGuestnetAnnotations returns guestnet's annotations of in, and DroppedAnnotationsKey
// when there were others.
func keepGuestnetAnnotations(in map[string]string) map[string]string {
	dropped := 0
	for k := range in {
		if !strings.HasPrefix(k, guestnetPrefix) {
			dropped++
		}
	}
	if dropped == 0 {
		return in
	}
	out := make(map[string]string, len(in)-dropped+1)
	for k, v := range in {
		if strings.HasPrefix(k, guestnetPrefix) && k != DroppedAnnotationsKey {
			out[k] = v
		}
	}
	out[DroppedAnnotationsKey] = strconv.Itoa(dropped)
	return out
}

// keepGuestnetLabels returns guestnet's labels of in (nil when there are none).
func keepGuestnetLabels(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		if strings.HasPrefix(k, guestnetPrefix) || k == ownership.ManagedByLabel {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
