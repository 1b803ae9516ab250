package ingress

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

func TestCommunityValues(t *testing.T) {
	g := NewWithT(t)
	// One community, three spellings: they must compare equal, or a tenant gets around an
	// allow list by writing another one.
	for _, s := range []string{"no-export", "65535:65281", "4294967041"} {
		v, ok := StandardCommunityValue(s)
		g.Expect(ok).To(BeTrue(), s)
		g.Expect(v).To(Equal(uint32(0xffffff01)), s)
	}
	for _, bad := range []string{"65536:1", "1:65536", "4294967296", "x", "1:2:3", ""} {
		_, ok := StandardCommunityValue(bad)
		g.Expect(ok).To(BeFalse(), bad)
	}
	v, ok := LargeCommunityValue("64512:001:100")
	g.Expect(ok).To(BeTrue())
	g.Expect(v).To(Equal("64512:1:100"))
	_, ok = LargeCommunityValue("64512:1:4294967296")
	g.Expect(ok).To(BeFalse())
	g.Expect(MetalLBCommunities(guestnetv1.BGPCommunities{Standard: []string{"4259840100"}, WellKnown: []string{"no-export"}, Large: []string{"64512:1:100"}})).
		To(Equal([]string{"65000:100", "65535:65281", "large:64512:1:100"}))
}

func TestCiliumBGPAdvertisement(t *testing.T) {
	g := NewWithT(t)
	gi := newGI()
	adv := CiliumBGPAdvertisement(gi, BGPAnnouncement{
		AdvertisementLabels: map[string]string{"advertise": "tenants", "app.kubernetes.io/managed-by": "someone"},
		Communities:         guestnetv1.BGPCommunities{Standard: []string{"65000:100"}, WellKnown: []string{"no-export"}},
	})
	g.Expect(adv.GroupVersionKind()).To(Equal(BGPAdvertisementGVK))
	g.Expect(adv.GetName()).To(Equal("k0smotron.tenant-a-web"))
	g.Expect(adv.GetLabels()).To(HaveKeyWithValue("advertise", "tenants"))
	g.Expect(adv.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "guestnet"), "guestnet's marks win")
	adverts, _, _ := unstructured.NestedSlice(adv.Object, "spec", "advertisements")
	g.Expect(adverts).To(HaveLen(1))
	a := adverts[0].(map[string]any)
	g.Expect(a["advertisementType"]).To(Equal("Service"))
	g.Expect(a["service"]).To(Equal(map[string]any{"addresses": []any{"LoadBalancerIP"}}))
	g.Expect(a["selector"]).To(Equal(map[string]any{"matchLabels": map[string]any{
		"io.kubernetes.service.namespace": "k0smotron", "io.kubernetes.service.name": "tenant-a-web"}}), "exactly its host Service")
	g.Expect(a["attributes"]).To(Equal(map[string]any{"communities": map[string]any{
		"standard": []any{"65000:100"}, "wellKnown": []any{"no-export"}}}))
}

func TestMetalLBObjects(t *testing.T) {
	g := NewWithT(t)
	gi := newGI(func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.IP = ""
		gi.Spec.LoadBalancer.IPs = []string{"10.2.6.220", "2001:db8:6::220"}
	})
	a := MetalLBAnnouncement{
		Policy: guestnetv1.MetalLBPolicy{LoadBalancerClass: "metallb.io/metallb", Namespace: "metallb",
			L2Advertisement:  &guestnetv1.MetalLBL2Advertisement{Interfaces: []string{"eth0"}},
			BGPAdvertisement: &guestnetv1.MetalLBBGPAdvertisement{Peers: []string{"tor"}}},
		Communities: guestnetv1.BGPCommunities{Standard: []string{"65000:100"}},
	}
	objs, err := BuildAnnouncers(gi, Admission{Announcer: AnnouncerMetalLB, MetalLB: a})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(objs.CiliumBGPAdvertisement).To(BeNil())

	pool := objs.MetalLBPool
	g.Expect(pool.GetNamespace()).To(Equal("metallb"))
	spec := pool.Object["spec"].(map[string]any)
	g.Expect(spec["addresses"]).To(Equal([]any{"10.2.6.220/32", "2001:db8:6::220/128"}))
	g.Expect(spec["autoAssign"]).To(BeFalse(), "hands out nothing on its own")
	g.Expect(spec["serviceAllocation"]).To(Equal(map[string]any{
		"namespaces": []any{"k0smotron"},
		"serviceSelectors": []any{map[string]any{"matchLabels": map[string]any{
			"app.kubernetes.io/managed-by":                            "guestnet",
			"guestnet.addons.cluster.x-k8s.io/guestingress-namespace": "k0smotron",
			"guestnet.addons.cluster.x-k8s.io/guestingress-name":      "web"}}},
	}))

	l2 := objs.MetalLBL2Advertisement.Object["spec"].(map[string]any)
	g.Expect(l2).To(Equal(map[string]any{"ipAddressPools": []any{"k0smotron.tenant-a-web"}, "interfaces": []any{"eth0"}}))
	bgp := objs.MetalLBBGPAdvertisement.Object["spec"].(map[string]any)
	g.Expect(bgp["peers"]).To(Equal([]any{"tor"}))
	g.Expect(bgp["communities"]).To(Equal([]any{"65000:100"}))
	g.Expect(bgp["aggregationLength"]).To(Equal(int64(32)))

	svc := toService(t, HostService(gi, nodePorts, Admission{Announcer: AnnouncerMetalLB, MetalLB: a}))
	g.Expect(svc.Annotations).To(HaveKeyWithValue(MetalLBLoadBalancerIPsAnnotation, "10.2.6.220,2001:db8:6::220"))
	g.Expect(svc.Annotations).To(HaveKeyWithValue(MetalLBAddressPoolAnnotation, "k0smotron.tenant-a-web"))
	g.Expect(svc.Annotations).NotTo(HaveKey(LBIPAMIPsAnnotation))
	g.Expect(*svc.Spec.IPFamilyPolicy).To(Equal(corev1.IPFamilyPolicyRequireDualStack))
	g.Expect(svc.Spec.IPFamilies).To(Equal([]corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}))
}

func TestHostServiceFamiliesAreAlwaysExplicit(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*guestnetv1.GuestIngress)
		want   []corev1.IPFamily
		policy corev1.IPFamilyPolicy
	}{
		"one IPv4 address": {func(*guestnetv1.GuestIngress) {}, []corev1.IPFamily{"IPv4"}, corev1.IPFamilyPolicySingleStack},
		"one IPv6 address": {func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.IP = "2001:db8::1" }, []corev1.IPFamily{"IPv6"}, corev1.IPFamilyPolicySingleStack},
		"IPv6 first, then IPv4": {func(gi *guestnetv1.GuestIngress) {
			gi.Spec.LoadBalancer.IP, gi.Spec.LoadBalancer.IPs = "", []string{"2001:db8::1", "10.2.6.1"}
		}, []corev1.IPFamily{"IPv6", "IPv4"}, corev1.IPFamilyPolicyRequireDualStack},
		"cidrs of both families": {func(gi *guestnetv1.GuestIngress) {
			gi.Spec.LoadBalancer.IP, gi.Spec.LoadBalancer.CIDRs = "", []string{"10.2.6.0/29", "2001:db8::/125"}
		}, []corev1.IPFamily{"IPv4", "IPv6"}, corev1.IPFamilyPolicyRequireDualStack},
		"a shared pool, no IP": {func(gi *guestnetv1.GuestIngress) {
			gi.Spec.LoadBalancer.IP, gi.Spec.LoadBalancer.PoolRef = "", &guestnetv1.PoolReference{Name: "shared"}
		}, []corev1.IPFamily{"IPv4"}, corev1.IPFamilyPolicySingleStack},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			svc := toService(t, HostService(newGI(tc.mutate), nodePorts, Admission{}))
			g.Expect(svc.Spec.IPFamilies).To(Equal(tc.want))
			g.Expect(svc.Spec.IPFamilyPolicy).To(Equal(ptr.To(tc.policy)))
		})
	}
	g := NewWithT(t)
	g.Expect(ValidateSpec(newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.IPFamilies = []corev1.IPFamily{"IPv6"} }), Announcement{})).
		To(ContainElement(ContainSubstring("but the fixed IPs are [IPv4]")))
	g.Expect(ValidateSpec(newGI(func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.IP, gi.Spec.LoadBalancer.CIDRs = "", []string{"10.2.6.0/29"}
		gi.Spec.LoadBalancer.IPFamilies = []corev1.IPFamily{"IPv4", "IPv6"}
	}), Announcement{})).To(ContainElement(ContainSubstring("no range of spec.loadBalancer.cidrs is IPv6")))
}

func TestLocalEndpointsFollowTheIngressPods(t *testing.T) {
	g := NewWithT(t)
	gi := newGI(func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		gi.Spec.LoadBalancer.IP, gi.Spec.LoadBalancer.IPs = "", []string{"10.2.6.220", "2001:db8:6::220"}
	})
	pod := func(machine, node, ip4, ip6 string, ready corev1.ConditionStatus) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "virt-launcher-" + machine, Namespace: "k0smotron",
			Labels: virtlauncher.MachineSelector("k0smotron", "tenant-a", machine)}}
		p.Spec.NodeName = node
		p.Status.PodIP = ip4
		p.Status.PodIPs = []corev1.PodIP{{IP: ip4}, {IP: ip6}}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}
		return p
	}
	pods := []corev1.Pod{
		pod("w-a", "host-1", "10.244.1.5", "fd00::1:5", corev1.ConditionTrue),
		pod("w-b", "host-2", "10.244.2.5", "fd00::2:5", corev1.ConditionTrue),
		pod("w-c", "host-3", "10.244.3.5", "fd00::3:5", corev1.ConditionTrue),
	}
	guestSlices := []discoveryv1.EndpointSlice{{Endpoints: []discoveryv1.Endpoint{
		{Addresses: []string{"192.168.1.4"}, NodeName: ptr.To("w-a"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		{Addresses: []string{"192.168.2.4"}, NodeName: ptr.To("w-b"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
	}}}
	eps := LocalEndpoints(guestSlices, pods)
	g.Expect(eps).To(Equal([]Endpoint{{Pod: "virt-launcher-w-a", Node: "host-1", IPs: []string{"10.244.1.5", "fd00::1:5"}, Ready: true}}),
		"only the worker whose guest node runs a ready ingress pod")

	svc := toService(t, HostService(gi, nodePorts, Admission{Announcer: AnnouncerCiliumBGP}))
	g.Expect(svc.Spec.Selector).To(BeEmpty(), "guestnet writes the endpoints")
	g.Expect(svc.Spec.ExternalTrafficPolicy).To(Equal(corev1.ServiceExternalTrafficPolicyLocal))

	slices := HostEndpointSlices(gi, nodePorts, eps)
	g.Expect(slices).To(HaveLen(2))
	g.Expect(*slices[0].Name).To(Equal("tenant-a-web-ipv4"))
	g.Expect(*slices[0].AddressType).To(Equal(discoveryv1.AddressTypeIPv4))
	g.Expect(slices[0].Labels).To(HaveKeyWithValue(discoveryv1.LabelServiceName, "tenant-a-web"))
	g.Expect(slices[0].Labels).To(HaveKeyWithValue(discoveryv1.LabelManagedBy, EndpointSliceManagedBy))
	g.Expect(slices[0].Endpoints).To(HaveLen(1))
	g.Expect(slices[0].Endpoints[0].Addresses).To(Equal([]string{"10.244.1.5"}))
	g.Expect(*slices[0].Endpoints[0].NodeName).To(Equal("host-1"), "the host node, for ETP Local and the announcers")
	g.Expect(slices[1].Endpoints[0].Addresses).To(Equal([]string{"fd00::1:5"}))
	g.Expect(*slices[0].Ports[0].Port).To(Equal(int32(30080)))
}

func TestGuestServiceMustCarryClientAddressesAndFamilies(t *testing.T) {
	g := NewWithT(t)
	local := newGI(func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		gi.Spec.LoadBalancer.IP, gi.Spec.LoadBalancer.IPs = "", []string{"10.2.6.220", "2001:db8:6::220"}
	})
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "projectcontour", Name: "envoy"},
		Spec: corev1.ServiceSpec{ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster, IPFamilies: []corev1.IPFamily{"IPv4"}}}
	g.Expect(GuestServiceKeepsNoClientAddress(local, svc)).To(ContainSubstring("Set externalTrafficPolicy: Local on it"))
	g.Expect(GuestServiceKeepsNoClientAddress(newGI(), svc)).To(BeEmpty(), "Cluster on the host: nothing to keep")
	g.Expect(GuestServiceMissesFamilies(local, svc)).To(ContainSubstring("served over IPv6, but Service projectcontour/envoy in the guest has ipFamilies [IPv4]"))
	svc.Spec.ExternalTrafficPolicy, svc.Spec.IPFamilies = corev1.ServiceExternalTrafficPolicyLocal, []corev1.IPFamily{"IPv4", "IPv6"}
	g.Expect(GuestServiceKeepsNoClientAddress(local, svc)).To(BeEmpty())
	g.Expect(GuestServiceMissesFamilies(local, svc)).To(BeEmpty())
}

func TestBGPAdvertisementInTheServedVersion(t *testing.T) {
	g := NewWithT(t)
	t.Cleanup(func() { UseBGPAdvertisementVersion("v2") })
	UseBGPAdvertisementVersion("v2alpha1")
	g.Expect(CiliumBGPAdvertisement(newGI(), BGPAnnouncement{}).GetAPIVersion()).To(Equal("cilium.io/v2alpha1"))
	g.Expect(NewBGPAdvertisement().GetAPIVersion()).To(Equal("cilium.io/v2alpha1"))
	UseBGPAdvertisementVersion("v3") // not one guestnet writes: ignored
	g.Expect(BGPAdvertisementGVK.Version).To(Equal("v2alpha1"))
}
