package nodeidentity

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

func cpGNI(serviceName string) *guestnetv1.GuestNodeIdentity {
	return &guestnetv1.GuestNodeIdentity{
		ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "tenant-a", UID: "uid-1"},
		Spec: guestnetv1.GuestNodeIdentitySpec{ClusterName: "tenant-a",
			ControlPlane: &guestnetv1.ControlPlaneAddressSpec{IP: "10.2.6.221", ServiceName: serviceName}},
	}
}

func TestControlPlaneService(t *testing.T) {
	k0s := &clusterv1.Cluster{Spec: clusterv1.ClusterSpec{ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
		APIGroup: "controlplane.cluster.x-k8s.io", Kind: K0smotronControlPlaneKind, Name: "tenant-a-cp"}}}
	kamaji := &clusterv1.Cluster{Spec: clusterv1.ClusterSpec{ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
		APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KamajiControlPlane", Name: "tenant-a"}}}
	for name, tc := range map[string]struct {
		gni     *guestnetv1.GuestNodeIdentity
		cluster *clusterv1.Cluster
		want    string
		ok      bool
	}{
		"k0smotron's kmc-<name>-lb":                {gni: cpGNI(""), cluster: k0s, want: "kmc-tenant-a-cp-lb", ok: true},
		"the named Service wins":                   {gni: cpGNI("api"), cluster: k0s, want: "api", ok: true},
		"another control plane needs a name":       {gni: cpGNI(""), cluster: kamaji},
		"another control plane, named":             {gni: cpGNI("tenant-a"), cluster: kamaji, want: "tenant-a", ok: true},
		"no Cluster yet: only the name is known":   {gni: cpGNI("api"), want: "api", ok: true},
		"no Cluster and no name: nothing is known": {gni: cpGNI("")},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			got, ok := ControlPlaneService(tc.gni, tc.cluster)
			g.Expect(ok).To(Equal(tc.ok))
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// The pool and the L2 policy select only the control plane's Service, hold only its IP and
// carry the GuestNodeIdentity's marks, never a GuestIngress's (whose sweep would take them).
func TestControlPlaneHostObjects(t *testing.T) {
	g := NewWithT(t)
	gni := cpGNI("")
	pool := ControlPlanePool(gni, "kmc-tenant-a-lb")
	g.Expect(pool.GetName()).To(Equal("k0smotron.tenant-a.control-plane"))
	g.Expect(pool.Object["spec"]).To(Equal(map[string]any{
		"blocks":          []any{map[string]any{"cidr": "10.2.6.221/32"}},
		"serviceSelector": map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": "k0smotron", "io.kubernetes.service.name": "kmc-tenant-a-lb"}},
	}))
	l2, err := ControlPlaneL2Policy(gni, "kmc-tenant-a-lb", ingress.Announcement{Interfaces: []string{"^eth0$"}})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(l2.Object["spec"]).To(HaveKeyWithValue("interfaces", []any{"^eth0$"}))
	g.Expect(l2.Object["spec"]).To(HaveKeyWithValue("loadBalancerIPs", true))
	for _, o := range []*unstructured.Unstructured{pool, l2} {
		g.Expect(ownership.IsControlPlaneObject(o, gni)).To(BeTrue())
		_, isGuestIngressOwn := ownership.GuestIngressOf(o)
		g.Expect(isGuestIngressOwn).To(BeFalse())
		g.Expect(o.GetAnnotations()).To(HaveKeyWithValue(ownership.NodeIdentityUIDAnnotation, "uid-1"))
	}
	other := cpGNI("")
	other.Name = "tenant-b"
	g.Expect(ownership.IsControlPlaneObject(pool, other)).To(BeFalse())

	_, err = ControlPlaneL2Policy(gni, "kmc-tenant-a-lb", ingress.Announcement{})
	g.Expect(err).To(MatchError(ContainSubstring("refusing an L2 announcement policy on every interface")))
}

func TestServedByCilium(t *testing.T) {
	g := NewWithT(t)
	lb := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
	ok, _ := ServedByCilium(lb)
	g.Expect(ok).To(BeTrue())
	lb.Spec.LoadBalancerClass = ptr.To(guestnetv1.DefaultLoadBalancerClass)
	ok, _ = ServedByCilium(lb)
	g.Expect(ok).To(BeTrue())
	lb.Spec.LoadBalancerClass = ptr.To("metallb.io/metallb")
	ok, why := ServedByCilium(lb)
	g.Expect(ok).To(BeFalse())
	g.Expect(why).To(ContainSubstring("metallb.io/metallb"))
	ok, why = ServedByCilium(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort}})
	g.Expect(ok).To(BeFalse())
	g.Expect(why).To(ContainSubstring("NodePort, not LoadBalancer"))
}

func TestOwnsIPRequest(t *testing.T) {
	g := NewWithT(t)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "k0smotron", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{"f:lbipam.cilium.io/ips":{}}}}`)},
	}}}
	g.Expect(OwnsIPRequest(svc, "guestnet")).To(BeFalse(), "another manager's request is not guestnet's to take off")
	svc.ManagedFields = append(svc.ManagedFields, metav1.ManagedFieldsEntry{Manager: "guestnet",
		FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{"f:lbipam.cilium.io/ips":{}}}}`)})
	g.Expect(OwnsIPRequest(svc, "guestnet")).To(BeTrue())
}
