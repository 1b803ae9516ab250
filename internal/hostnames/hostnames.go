// Package hostnames is the one place that names the objects guestnet creates: for a
// GuestIngress, the host LoadBalancer Service in the Cluster's namespace and the
// cluster-scoped CiliumLoadBalancerIPPool and CiliumL2AnnouncementPolicy; for a
// GuestWebhookBridge, its host and guest Services and the URLs the guest apiserver dials.
// How those objects are labelled and recognised as guestnet's is internal/ownership.
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

// ControlPlanePool names the CiliumLoadBalancerIPPool (and the CiliumL2AnnouncementPolicy)
// guestnet creates for the control plane address of gni: "<namespace>.<cluster>.control-plane",
// e.g. "k0smotron.tenant-a.control-plane". A GuestIngress's pool of the same name (cluster
// "tenant-a.control", GuestIngress "plane") is told apart by its marks (internal/ownership).
func ControlPlanePool(gni *guestnetv1.GuestNodeIdentity) string {
	return ObjectName(gni.Namespace + "." + gni.Spec.ClusterName + ".control-plane")
}
