package e2e

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// TestLab_CiliumBGPAdvertisesLoadBalancerIPs runs the lab's BGP path: the real LB-IPAM gives
// Services of class io.cilium/bgp-control-plane their IPs, two host nodes' played Cilium BGP
// speakers hold real BGP sessions (GoBGP) with the lab's upstream router, and the router's
// RIB shows what a CiliumBGPAdvertisement selects: the /32 from each node (its own next
// hop) with the advertisement's communities; nothing for a Service the advertisement does
// not select or of the L2 class; for externalTrafficPolicy Local only the node with the
// endpoint, following it; withdrawn when the Service is deselected or the advertisement
// goes.
func TestLab_CiliumBGPAdvertisesLoadBalancerIPs(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	host := l.Host.Client
	ns := uniqueName("bgp")
	g.Expect(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	startCiliumStandIn(t, l)

	const node1, node2 = "10.244.0.181", "10.244.0.182"
	router, err := l.StartBGPRouter(ctx, lab.BGPRouterOptions{Neighbors: []lab.BGPNeighbor{{Address: node1, ASN: 65001}, {Address: node2, ASN: 65001}}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(router.Stop)
	for i, addr := range []string{node1, node2} {
		s, err := l.StartCiliumBGPStandIn(ctx, lab.CiliumBGPOptions{NodeName: lab.HostNodes[i], Address: addr, NodeLabels: map[string]string{"bgp.lab/" + ns: "speaker"}})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(s.Stop)
	}

	create := func(kind, name string, labels map[string]string, spec map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		u.SetGroupVersionKind(schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: kind})
		u.SetName(name)
		u.SetLabels(labels)
		g.Expect(host.Create(ctx, u)).To(Succeed())
		t.Cleanup(func() { _ = host.Delete(context.Background(), u) })
		return u
	}
	create("CiliumLoadBalancerIPPool", ns, nil, map[string]any{
		"blocks":          []any{map[string]any{"cidr": "10.98.253.0/29"}},
		"serviceSelector": map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": ns}},
	})
	// What the platform sets up: the nodes it selects peer with the router.
	create("CiliumBGPPeerConfig", ns, nil, map[string]any{
		"families": []any{map[string]any{"afi": "ipv4", "safi": "unicast", "advertisements": map[string]any{"matchLabels": map[string]any{"advertise": ns}}}},
	})
	create("CiliumBGPClusterConfig", ns, nil, map[string]any{
		"nodeSelector": map[string]any{"matchLabels": map[string]any{"bgp.lab/" + ns: "speaker"}},
		"bgpInstances": []any{map[string]any{"name": "lab", "localASN": int64(65001), "peers": []any{map[string]any{
			"name": "router", "peerAddress": lab.BGPRouterAddress, "peerASN": int64(lab.BGPRouterASN), "peerConfigRef": map[string]any{"name": ns},
		}}}},
	})
	// What guestnet will create per GuestIngress: Services by label, with communities.
	advert := create("CiliumBGPAdvertisement", ns, map[string]string{"advertise": ns}, map[string]any{
		"advertisements": []any{map[string]any{
			"advertisementType": "Service",
			"service":           map[string]any{"addresses": []any{"LoadBalancerIP"}},
			"selector":          map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": ns, "announce": "yes"}},
			"attributes": map[string]any{"communities": map[string]any{
				"standard": []any{"65000:100"}, "wellKnown": []any{"no-export"}, "large": []any{"65000:1:2"},
			}},
		}},
	})

	createService := func(name, class string, announce bool, etp corev1.ServiceExternalTrafficPolicy) string {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(class), ExternalTrafficPolicy: etp,
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		if announce {
			svc.Labels = map[string]string{"announce": "yes"}
		}
		g.Expect(host.Create(ctx, svc)).To(Succeed())
		g.Eventually(func(g Gomega) {
			g.Expect(host.Get(ctx, client.ObjectKeyFromObject(svc), svc)).To(Succeed())
			g.Expect(svc.Status.LoadBalancer.Ingress).NotTo(BeEmpty(), "LB-IPAM has not given %s an IP", name)
		}).WithTimeout(30 * time.Second).Should(Succeed())
		return svc.Status.LoadBalancer.Ingress[0].IP + "/32"
	}
	const bgpClass, l2Class = "io.cilium/bgp-control-plane", "io.cilium/l2-announcer"
	other := createService("other", bgpClass, false, corev1.ServiceExternalTrafficPolicyCluster)
	l2 := createService("l2", l2Class, true, corev1.ServiceExternalTrafficPolicyCluster)
	web := createService("web", bgpClass, true, corev1.ServiceExternalTrafficPolicyCluster)

	nextHops := func(routes []lab.BGPRoute) []string {
		var out []string
		for _, r := range routes {
			out = append(out, r.NextHop)
		}
		return out
	}
	wait := func(prefix string, want ...string) []lab.BGPRoute {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		routes, err := router.WaitForRoutes(wctx, prefix, func(rs []lab.BGPRoute) bool {
			ok, _ := ConsistOf(want).Match(nextHops(rs))
			return ok
		})
		g.Expect(err).NotTo(HaveOccurred())
		return routes
	}
	routes := wait(web, node1, node2)
	for _, r := range routes {
		g.Expect(r.ASPath).To(Equal([]uint32{65001}))
		g.Expect(r.Communities).To(ConsistOf("65000:100", "no-export"))
		g.Expect(r.LargeCommunities).To(ConsistOf("65000:1:2"))
		g.Expect(r.Peer).To(Equal(r.NextHop), "each node's session comes from its own address")
	}
	peers, err := router.Peers(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(peers).To(ConsistOf(
		lab.BGPPeer{Address: node1, ASN: 65001, State: "established"},
		lab.BGPPeer{Address: node2, ASN: 65001, State: "established"}))
	// Every event recomputes every path: once web's are there, the others' verdicts are too.
	for _, prefix := range []string{other, l2} {
		g.Expect(router.RoutesFor(ctx, prefix)).To(BeEmpty(), "%s is not advertised", prefix)
	}

	// externalTrafficPolicy Local: only the node with a ready endpoint, following it.
	local := createService("local", bgpClass, true, corev1.ServiceExternalTrafficPolicyLocal)
	g.Consistently(func() ([]lab.BGPRoute, error) { return router.RoutesFor(ctx, local) }).
		WithTimeout(2*time.Second).Should(BeEmpty(), "no node has an endpoint")
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "local-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: "local", discoveryv1.LabelManagedBy: "lab",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.90"}, NodeName: ptr.To(lab.HostNodes[1])}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}
	g.Expect(host.Create(ctx, slice)).To(Succeed())
	wait(local, node2)
	slice.Endpoints[0].NodeName = ptr.To(lab.HostNodes[0])
	g.Expect(host.Update(ctx, slice)).To(Succeed())
	wait(local, node1)

	// Deselecting the Service withdraws its paths from both nodes; the others stay.
	svc := &corev1.Service{}
	g.Expect(host.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, svc)).To(Succeed())
	delete(svc.Labels, "announce")
	g.Expect(host.Update(ctx, svc)).To(Succeed())
	wait(web)
	g.Expect(router.RoutesFor(ctx, local)).To(HaveLen(1))
	// Deleting the advertisement withdraws what it announced.
	g.Expect(host.Delete(ctx, advert)).To(Succeed())
	wait(local)
}
