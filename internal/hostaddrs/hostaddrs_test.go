package hostaddrs

import (
	"context"
	"net/netip"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// Read is a pure function of what the reader holds: a fake client is enough here (the lab
// test e2e/hostaddrs_test.go reads a real apiserver's objects through the Watcher).
func TestRead(t *testing.T) {
	g := NewWithT(t)
	s := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(s)).To(Succeed())
	objs := []runtime.Object{
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "kubernetes", Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.10"}}, {Addresses: []string{"192.0.2.11"}}},
		},
		// Another Service's slice in default is not the apiserver's.
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-x", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.99"}}},
		},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
			Spec: corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "192.0.2.21"}, {Type: corev1.NodeExternalIP, Address: "2001:db8::21"},
				{Type: corev1.NodeHostName, Address: "n1"}, {Type: corev1.NodeInternalDNS, Address: "n1.example"}}}},
		&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16", "fd00:96::/112"}}},
	}
	set, err := Read(context.Background(), fake.NewClientBuilder().WithScheme(s).WithRuntimeObjects(objs...).Build())
	g.Expect(err).NotTo(HaveOccurred())
	var got []string
	for _, e := range set.Entries() {
		got = append(got, e.String())
	}
	g.Expect(got).To(Equal([]string{
		"10.96.0.0/16 (ServiceCIDR)", "10.244.1.0/24 (PodCIDR)", "192.0.2.10 (APIServer)", "192.0.2.11 (APIServer)",
		"192.0.2.21 (NodeAddress)", "2001:db8::21 (NodeAddress)", "fd00:1::/64 (PodCIDR)", "fd00:96::/112 (ServiceCIDR)",
	}))
}

func TestSetOverlaps(t *testing.T) {
	g := NewWithT(t)
	set := New(Entry{Kind: NodeAddress, Prefix: netip.MustParsePrefix("10.2.6.7/32")},
		Entry{Kind: ServiceCIDR, Prefix: netip.MustParsePrefix("10.96.0.0/12")}).
		With(Reserved, netip.MustParsePrefix("10.2.6.240/28"))
	g.Expect(set.Has(netip.MustParseAddr("10.2.6.7"))).To(HaveLen(1))
	g.Expect(set.Has(netip.MustParseAddr("10.2.6.8"))).To(BeEmpty())
	g.Expect(set.Has(netip.MustParseAddr("::ffff:10.2.6.7"))).To(BeEmpty(), "families are compared as written; admission refuses mapped addresses")
	g.Expect(Kinds(set.InPrefix(netip.MustParsePrefix("10.0.0.0/8")))).To(Equal("a host Node's address, in the host's Service network, in a range the host admin reserved"))
	g.Expect(set.InPrefix(netip.MustParsePrefix("10.2.6.0/29"))).To(HaveLen(1), "a range that holds one host address")
	g.Expect(set.InRange(ingress.AddrRange{From: netip.MustParseAddr("10.2.6.250"), To: netip.MustParseAddr("10.2.7.3")})).To(HaveLen(1))
	g.Expect(set.InPrefix(netip.MustParsePrefix("10.2.6.8/29"))).To(BeEmpty())
	g.Expect(New().Has(netip.MustParseAddr("10.2.6.7"))).To(BeEmpty())
	g.Expect(set.Equal(set.With(NodeAddress, netip.MustParsePrefix("10.2.6.7/32")))).To(BeTrue(), "no duplicates")
}
