package ownership

import (
	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// Marks of the objects guestnet creates for a GuestWebhookBridge (internal/hostnames names
// them).
const (
	// BridgeNamespaceLabel and BridgeNameLabel name the GuestWebhookBridge an object belongs
	// to, on its host Services and on its guest Services (which cannot carry an owner
	// reference to a host object). The exact "<namespace>/<name>" is in BridgeAnnotation.
	BridgeNamespaceLabel = "guestnet.addons.cluster.x-k8s.io/bridge-namespace"
	BridgeNameLabel      = "guestnet.addons.cluster.x-k8s.io/bridge-name"
	BridgeAnnotation     = "guestnet.addons.cluster.x-k8s.io/bridge"
)

// BridgeID is how guest objects name the host GuestWebhookBridge that changed them:
// "<namespace>/<name>".
func BridgeID(gwb *guestnetv1.GuestWebhookBridge) string {
	return gwb.Namespace + "/" + gwb.Name
}

// BridgeHostLabels are the labels of a host Service of gwb for the guest Service
// svcNamespace/svcName.
func BridgeHostLabels(gwb *guestnetv1.GuestWebhookBridge, svcNamespace, svcName string) map[string]string {
	return map[string]string{
		ManagedByLabel:             ManagedByValue,
		ClusterNameLabel:           gwb.Spec.ClusterName,
		BridgeNamespaceLabel:       gwb.Namespace,
		BridgeNameLabel:            hostnames.LabelValue(gwb.Name),
		GuestServiceNamespaceLabel: svcNamespace,
		GuestServiceNameLabel:      svcName,
	}
}

// BridgeGuestLabels are the labels of a guest Service of gwb.
func BridgeGuestLabels(gwb *guestnetv1.GuestWebhookBridge) map[string]string {
	return map[string]string{
		ManagedByLabel:       ManagedByValue,
		BridgeNamespaceLabel: gwb.Namespace,
		BridgeNameLabel:      hostnames.LabelValue(gwb.Name),
	}
}

// SelectBridge selects every Service of gwb, in the host or in the guest.
func SelectBridge(gwb *guestnetv1.GuestWebhookBridge) map[string]string {
	return BridgeGuestLabels(gwb)
}

// IsBridgeObject reports whether a Service (host or guest) belongs to gwb: labelled and
// annotated for it. Nothing else is ever changed or deleted by the bridge.
func IsBridgeObject(obj interface {
	GetLabels() map[string]string
	GetAnnotations() map[string]string
}, gwb *guestnetv1.GuestWebhookBridge) bool {
	return obj.GetLabels()[ManagedByLabel] == ManagedByValue && obj.GetAnnotations()[BridgeAnnotation] == BridgeID(gwb)
}
