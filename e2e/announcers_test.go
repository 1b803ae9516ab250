package e2e

// GuestIngresses announced the ways hosting providers run (issue 20, docs/announcer-*.md), in
// the lab with the real announcers where they run: MetalLB v0.16.1's controller and speakers
// (L2 and native BGP), and a real BGP router (GoBGP) learning the routes.

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// A GuestIngress of MetalLB's class, admitted by a policy that names an L2 and a BGP
// advertisement: the real MetalLB gives its host Service the IP from guestnet's pool, one
// speaker answers ARP for it, and the BGP router learns the /32 from every speaker with the
// admitted community. A community the policy does not list is refused and changes nothing;
// the policy narrowed to L2 alone takes the BGP route away (held within admitted) while ARP
// still answers; deleting the GuestIngress takes the address off the network.
func TestGuestIngress_AnnouncedByMetalLB(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	c := l.Host.Client
	ns := uniqueName("mlb")

	m, err := l.StartMetalLB(ctx, lab.MetalLBOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(m.Stop)
	const routerAddress, routerASN, speakerASN = "10.244.0.161", 65000, 64512
	router, err := l.StartBGPRouter(ctx, lab.BGPRouterOptions{Address: routerAddress, ASN: routerASN,
		DynamicNeighbors: []lab.BGPDynamicNeighbor{{Prefix: lab.MetalLBSegmentCIDR, ASN: speakerASN}}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(router.Stop)
	peer := metallbObject(lab.MetalLBBGPPeerGVK, "router-"+ns, map[string]any{
		"myASN": int64(speakerASN), "peerASN": int64(routerASN), "peerAddress": routerAddress,
	})
	g.Expect(c.Create(ctx, peer)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), peer) })

	policy := &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "mlb-" + ns},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector:   metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			Addresses:           []string{"10.98.162.0/24"},
			LoadBalancerClasses: []string{lab.MetalLBClass},
			MetalLB: &guestnetv1.MetalLBPolicy{
				LoadBalancerClass: lab.MetalLBClass,
				Namespace:         lab.MetalLBNamespace,
				L2Advertisement: &guestnetv1.MetalLBL2Advertisement{Interfaces: []string{"eth0"},
					NodeSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{lab.MetalLBSpeakerLabel: "true"}}}},
				BGPAdvertisement: &guestnetv1.MetalLBBGPAdvertisement{Peers: []string{"router-" + ns},
					Communities: &guestnetv1.BGPCommunities{Standard: []string{"65000:100"}}},
			},
			HostService: guestnetv1.HostServicePolicy{ExternalTrafficPolicies: []corev1.ServiceExternalTrafficPolicy{"Cluster", "Local"}},
		},
	}
	createOwnPolicy(t, l, ns, policy)

	gc := createIngressCluster(t, l, ns, "tenant-a", 31084, 31444)
	addEnvoyWorker(t, l, gc, ns+"-md-0-a", "10.244.62.11", 31084, 31444)
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})

	const ip = "10.98.162.10"
	prefix := ip + "/32"
	gi := newGuestIngress(ns, "web", gc.Name, guestSvc, ip, ptr.To[int32](31084), ptr.To[int32](31444))
	gi.Spec.LoadBalancer.L2 = nil
	gi.Spec.LoadBalancer.Class = lab.MetalLBClass
	gi.Spec.LoadBalancer.BGP = &guestnetv1.BGPAnnouncementSpec{Communities: &guestnetv1.BGPCommunities{Standard: []string{"4259840100"}}} // 65000:100
	g.Expect(c.Create(ctx, gi)).To(Succeed())

	got := eventuallyGuestIngressReady(t, l, gi)
	g.Expect(got.Status.LoadBalancerIP).To(Equal(ip), "MetalLB gave the IP from guestnet's pool")
	poolKey := client.ObjectKey{Namespace: lab.MetalLBNamespace, Name: hostnames.Pool(gi)}
	pool := ingress.NewMetalLBPool()
	g.Expect(c.Get(ctx, poolKey, pool)).To(Succeed())
	g.Expect(pool.Object["spec"]).To(HaveKeyWithValue("autoAssign", false))
	g.Expect(pool.Object["spec"]).To(HaveKeyWithValue("serviceAllocation", HaveKeyWithValue("namespaces", []any{ns})))

	t.Run("one speaker answers ARP for the IP", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func() ([]string, error) { return m.AnnouncingNodes(ip) }).WithTimeout(giTimeout).Should(HaveLen(1))
	})
	t.Run("the router learns the /32 from every speaker, with the admitted community", func(t *testing.T) {
		g := NewWithT(t)
		routes, err := waitForRoutes(ctx, router, prefix, func(r []lab.BGPRoute) bool { return len(r) == len(m.Speakers) })
		g.Expect(err).NotTo(HaveOccurred())
		var hops []string
		for _, r := range routes {
			hops = append(hops, r.NextHop)
			g.Expect(r.Communities).To(ConsistOf("65000:100"), "next hop %s", r.NextHop)
		}
		var want []string
		for _, s := range m.Speakers {
			want = append(want, s.Address)
		}
		g.Expect(hops).To(ConsistOf(want))
	})
	t.Run("a community the policy does not list is refused, and nothing changes", func(t *testing.T) {
		g := NewWithT(t)
		updateGuestIngress(t, l, gi, func(gi *guestnetv1.GuestIngress) {
			gi.Spec.LoadBalancer.BGP.Communities.WellKnown = []string{"blackhole"}
		})
		g.Eventually(func() *metav1.Condition {
			return conditions.Get(getGuestIngress(t, l, gi), guestnetv1.AdmittedCondition)
		}).WithTimeout(giTimeout).Should(And(
			HaveField("Reason", guestnetv1.NotAllowedReason),
			HaveField("Message", ContainSubstring("BGP community blackhole (it allows 65000:100)"))))
		routes, err := router.RoutesFor(ctx, prefix)
		g.Expect(err).NotTo(HaveOccurred())
		for _, r := range routes {
			g.Expect(r.Communities).NotTo(ContainElement("blackhole"))
			g.Expect(r.Communities).NotTo(ContainElement("65535:666"))
		}
		updateGuestIngress(t, l, gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.BGP.Communities.WellKnown = nil })
		eventuallyGuestIngressReady(t, l, gi)
		_, err = waitForRoutes(ctx, router, prefix, func(r []lab.BGPRoute) bool { return len(r) == len(m.Speakers) })
		g.Expect(err).NotTo(HaveOccurred())
	})
	t.Run("the policy narrowed to L2: the BGP route goes, ARP still answers", func(t *testing.T) {
		g := NewWithT(t)
		// Without a community the route is still announced; then the admin takes BGP away.
		updateGuestIngress(t, l, gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.BGP = nil })
		_, err := waitForRoutes(ctx, router, prefix, func(r []lab.BGPRoute) bool {
			return len(r) == len(m.Speakers) && len(r[0].Communities) == 0
		})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(updatePolicy(ctx, c, policy, func(p *guestnetv1.GuestIngressPolicy) { p.Spec.MetalLB.BGPAdvertisement = nil })).To(Succeed())
		_, err = waitForRoutes(ctx, router, prefix, func(r []lab.BGPRoute) bool { return len(r) == 0 })
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func() bool {
			return apierrors.IsNotFound(c.Get(ctx, poolKey, ingress.NewMetalLBBGPAdvertisement()))
		}).WithTimeout(giTimeout).Should(BeTrue())
		g.Expect(conditions.IsTrue(getGuestIngress(t, l, gi), guestnetv1.ReadyCondition)).To(BeTrue(), "still admitted, for L2")
		g.Expect(m.AnnouncingNodes(ip)).To(HaveLen(1))
	})
	t.Run("deleting the GuestIngress takes the address off the network", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(c.Delete(ctx, gi)).To(Succeed())
		g.Eventually(func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(gi), &guestnetv1.GuestIngress{}))
		}).WithTimeout(giTimeout).Should(BeTrue())
		for _, obj := range []*unstructured.Unstructured{ingress.NewMetalLBPool(), ingress.NewMetalLBL2Advertisement(), ingress.NewMetalLBBGPAdvertisement()} {
			g.Expect(apierrors.IsNotFound(c.Get(ctx, poolKey, obj))).To(BeTrue(), "%s left behind", obj.GetKind())
		}
		g.Eventually(func() ([]string, error) { return m.AnnouncingNodes(ip) }).WithTimeout(giTimeout).Should(BeEmpty())
	})
}

// updateGuestIngress changes the GuestIngress's spec, retrying on conflicts.
func updateGuestIngress(t *testing.T, l *lab.Lab, gi *guestnetv1.GuestIngress, mutate func(*guestnetv1.GuestIngress)) {
	t.Helper()
	if err := update(testContext(t), l.Host.Client, gi, func() *guestnetv1.GuestIngress { return &guestnetv1.GuestIngress{} }, mutate); err != nil {
		t.Fatalf("updating GuestIngress: %v", err)
	}
}

// createOwnPolicy creates namespace ns, out of the lab-wide policy's reach, and policy, its
// own, which goes with the test.
func createOwnPolicy(t *testing.T, l *lab.Lab, ns string, policy *guestnetv1.GuestIngressPolicy) {
	t.Helper()
	ctx, c := testContext(t), l.Host.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}}); err != nil {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
	if err := c.Create(ctx, policy); err != nil {
		t.Fatalf("creating GuestIngressPolicy %s: %v", policy.Name, err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), policy) })
}

// waitForRoutes waits up to giTimeout for the router's paths for prefix to satisfy ok.
func waitForRoutes(ctx context.Context, router *lab.BGPRouter, prefix string, ok func([]lab.BGPRoute) bool) ([]lab.BGPRoute, error) {
	ctx, cancel := context.WithTimeout(ctx, giTimeout)
	defer cancel()
	return router.WaitForRoutes(ctx, prefix, ok)
}

// A GuestIngress of Cilium's BGP class, with the platform's peering set up once (a
// CiliumBGPClusterConfig for two host nodes, a CiliumBGPPeerConfig choosing advertisements by
// the policy's label): guestnet's CiliumBGPAdvertisement makes the router learn the /32 from
// both nodes with the admitted community; a community the policy does not list is refused
// (fail closed: the route goes, and the router never sees it); deleting the GuestIngress
// withdraws the route and the advertisement.
func TestGuestIngress_AnnouncedWithBGP(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	c := l.Host.Client
	ns := uniqueName("bgp-gi")
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
	platform := func(kind string, spec map[string]any) {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		u.SetGroupVersionKind(ingress.BGPAdvertisementGVK.GroupVersion().WithKind(kind))
		u.SetName(ns)
		g.Expect(c.Create(ctx, u)).To(Succeed())
		t.Cleanup(func() { _ = c.Delete(context.Background(), u) })
	}
	platform("CiliumBGPPeerConfig", map[string]any{"families": []any{map[string]any{"afi": "ipv4", "safi": "unicast",
		"advertisements": map[string]any{"matchLabels": map[string]any{"bgp.example.com/advertise": ns}}}}})
	platform("CiliumBGPClusterConfig", map[string]any{
		"nodeSelector": map[string]any{"matchLabels": map[string]any{"bgp.lab/" + ns: "speaker"}},
		"bgpInstances": []any{map[string]any{"name": "lab", "localASN": int64(65001), "peers": []any{map[string]any{
			"name": "router", "peerAddress": lab.BGPRouterAddress, "peerASN": int64(lab.BGPRouterASN), "peerConfigRef": map[string]any{"name": ns},
		}}}},
	})
	policy := &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bgp-" + ns},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector:   metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			Addresses:           []string{"10.98.163.0/24"},
			LoadBalancerClasses: []string{ingress.CiliumBGPClass},
			BGPAdvertisement: &guestnetv1.BGPAdvertisementPolicy{
				AdvertisementLabels: map[string]string{"bgp.example.com/advertise": ns},
				Communities:         &guestnetv1.BGPCommunities{Standard: []string{"65000:100"}},
			},
		},
	}
	createOwnPolicy(t, l, ns, policy)

	gc := createIngressCluster(t, l, ns, "tenant-a", 31085, 31445)
	addEnvoyWorker(t, l, gc, ns+"-md-0-a", "10.244.63.11", 31085, 31445)
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})

	const ip = "10.98.163.10"
	prefix := ip + "/32"
	gi := newGuestIngress(ns, "web", gc.Name, guestSvc, ip, ptr.To[int32](31085), ptr.To[int32](31445))
	gi.Spec.LoadBalancer.L2 = nil
	gi.Spec.LoadBalancer.Class = ingress.CiliumBGPClass
	gi.Spec.LoadBalancer.BGP = &guestnetv1.BGPAnnouncementSpec{Communities: &guestnetv1.BGPCommunities{Standard: []string{"65000:100"}}}
	g.Expect(c.Create(ctx, gi)).To(Succeed())
	got := eventuallyGuestIngressReady(t, l, gi)
	g.Expect(got.Status.LoadBalancerIP).To(Equal(ip))
	advert := ingress.NewBGPAdvertisement()
	g.Expect(c.Get(ctx, client.ObjectKey{Name: hostnames.Pool(gi)}, advert)).To(Succeed())
	g.Expect(advert.GetLabels()).To(HaveKeyWithValue("bgp.example.com/advertise", ns))

	both := func(r []lab.BGPRoute) bool { return len(r) == 2 }
	t.Run("the router learns the /32 from both nodes, with the admitted community", func(t *testing.T) {
		g := NewWithT(t)
		routes, err := waitForRoutes(ctx, router, prefix, both)
		g.Expect(err).NotTo(HaveOccurred())
		var hops []string
		for _, r := range routes {
			hops = append(hops, r.NextHop)
			g.Expect(r.Communities).To(ConsistOf("65000:100"))
		}
		g.Expect(hops).To(ConsistOf(node1, node2))
	})
	t.Run("a community the policy does not list: refused, the route goes, the router never sees it", func(t *testing.T) {
		g := NewWithT(t)
		updateGuestIngress(t, l, gi, func(gi *guestnetv1.GuestIngress) {
			gi.Spec.LoadBalancer.BGP.Communities.Standard = []string{"65535:666"}
		})
		g.Eventually(func() *metav1.Condition {
			return conditions.Get(getGuestIngress(t, l, gi), guestnetv1.AdmittedCondition)
		}).WithTimeout(giTimeout).Should(HaveField("Message", ContainSubstring("BGP community 65535:666 (it allows 65000:100)")))
		_, err := waitForRoutes(ctx, router, prefix, func(r []lab.BGPRoute) bool { return len(r) == 0 })
		g.Expect(err).NotTo(HaveOccurred())
		updateGuestIngress(t, l, gi, func(gi *guestnetv1.GuestIngress) {
			gi.Spec.LoadBalancer.BGP.Communities.Standard = []string{"65000:100"}
		})
		routes, err := waitForRoutes(ctx, router, prefix, both)
		g.Expect(err).NotTo(HaveOccurred())
		for _, r := range routes {
			g.Expect(r.Communities).To(ConsistOf("65000:100"))
		}
	})
	t.Run("deleting the GuestIngress withdraws the route and the advertisement", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(c.Delete(ctx, gi)).To(Succeed())
		_, err := waitForRoutes(ctx, router, prefix, func(r []lab.BGPRoute) bool { return len(r) == 0 })
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKey{Name: hostnames.Pool(gi)}, ingress.NewBGPAdvertisement()))
		}).WithTimeout(giTimeout).Should(BeTrue())
	})
}
