package nodeidentity

import (
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// K0smotronControlPlaneKind is k0smotron's control plane kind. For one whose
// spec.service.type is LoadBalancer, k0smotron applies the host Service kmc-<name>-lb and
// makes its load-balancer IP the control plane's external address, the Cluster's endpoint
// and the workers' join address (docs/node-identity-research.md, "The join address").
const K0smotronControlPlaneKind = "K0smotronControlPlane"

// ControlPlaneService is the name of the control plane's host Service of gni: spec.controlPlane.
// serviceName, else k0smotron's kmc-<control plane name>-lb when the Cluster's control plane is
// a K0smotronControlPlane; false when it cannot be told.
func ControlPlaneService(gni *guestnetv1.GuestNodeIdentity, cluster *clusterv1.Cluster) (string, bool) {
	if cp := gni.Spec.ControlPlane; cp != nil && cp.ServiceName != "" {
		return cp.ServiceName, true
	}
	if cluster == nil {
		return "", false
	}
	ref := cluster.Spec.ControlPlaneRef
	if ref.Kind != K0smotronControlPlaneKind || ref.Name == "" {
		return "", false
	}
	return hostnames.ServiceName("kmc-" + ref.Name + "-lb"), true
}

// ControlPlanePool is the CiliumLoadBalancerIPPool guestnet applies for the control plane
// address of gni: the lone IP, for the one Service service of gni's namespace.
func ControlPlanePool(gni *guestnetv1.GuestNodeIdentity, service string) *unstructured.Unstructured {
	var prefixes []netip.Prefix
	if ip, err := netip.ParseAddr(gni.Spec.ControlPlane.IP); err == nil {
		prefixes = append(prefixes, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return ingress.PoolFor(controlPlaneMarks(gni), prefixes, ingress.ServiceSelectorOf(gni.Namespace, service))
}

// ControlPlaneL2Policy is the CiliumL2AnnouncementPolicy guestnet applies for it, announcing
// from where the admitting policy allows (a).
func ControlPlaneL2Policy(gni *guestnetv1.GuestNodeIdentity, service string, a ingress.Announcement) (*unstructured.Unstructured, error) {
	return ingress.L2PolicyFor(controlPlaneMarks(gni), a, ingress.ServiceSelectorOf(gni.Namespace, service),
		"the control plane address of GuestNodeIdentity "+gni.Namespace+"/"+gni.Name)
}

func controlPlaneMarks(gni *guestnetv1.GuestNodeIdentity) ingress.Marks {
	return ingress.Marks{Name: hostnames.ControlPlanePool(gni), Labels: ownership.ControlPlaneLabels(gni), Annotations: ownership.ControlPlaneAnnotations(gni)}
}

// ServedByCilium reports whether Cilium's LB-IPAM and L2 announcer serve svc: a LoadBalancer
// Service whose loadBalancerClass is unset or Cilium's L2 announcer's. It returns what is
// wrong otherwise.
func ServedByCilium(svc *corev1.Service) (bool, string) {
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false, "is of type " + string(svc.Spec.Type) + ", not LoadBalancer"
	}
	if c := svc.Spec.LoadBalancerClass; c != nil && *c != guestnetv1.DefaultLoadBalancerClass {
		return false, "has loadBalancerClass " + *c + ", which Cilium's L2 announcer does not serve (unset or " + guestnetv1.DefaultLoadBalancerClass + ")"
	}
	return true, ""
}

// OwnsIPRequest reports whether guestnet's field manager owns the Service's
// lbipam.cilium.io/ips annotation (it applied it), read from the Service's managedFields.
func OwnsIPRequest(svc *corev1.Service, fieldManager string) bool {
	key := `"f:` + ingress.LBIPAMIPsAnnotation + `"`
	for _, e := range svc.ManagedFields {
		if e.Manager == fieldManager && e.FieldsV1 != nil && strings.Contains(e.FieldsV1.GetRawString(), key) {
			return true
		}
	}
	return false
}
