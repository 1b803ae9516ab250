package policy

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// The announcers a policy chooses (issue 20): everything a tenant attaches to its route is
// admitted or refused by the policy, whatever spelling it uses.
func TestAdmitAnnouncers(t *testing.T) {
	tenantA := namespace("tenant-a", map[string]string{"tenant": "a"})
	bgpPolicy := func(mutate ...func(*guestnetv1.GuestIngressPolicy)) guestnetv1.GuestIngressPolicy {
		return pol("bgp", append([]func(*guestnetv1.GuestIngressPolicy){func(p *guestnetv1.GuestIngressPolicy) {
			p.Spec.LoadBalancerClasses = []string{ingress.CiliumBGPClass}
			p.Spec.BGPAdvertisement = &guestnetv1.BGPAdvertisementPolicy{
				AdvertisementLabels:        map[string]string{"bgp.example.com/advertise": "tenants"},
				AllowedAdvertisementLabels: []string{"bgp.example.com/upstream=transit"},
				Communities:                &guestnetv1.BGPCommunities{Standard: []string{"65000:100"}, WellKnown: []string{"no-export"}, Large: []string{"64512:1:100"}},
			}
		}}, mutate...)...)
	}
	metalLBPolicy := func(mutate ...func(*guestnetv1.GuestIngressPolicy)) guestnetv1.GuestIngressPolicy {
		return pol("metallb", append([]func(*guestnetv1.GuestIngressPolicy){func(p *guestnetv1.GuestIngressPolicy) {
			p.Spec.LoadBalancerClasses = []string{"metallb.io/metallb"}
			p.Spec.MetalLB = &guestnetv1.MetalLBPolicy{LoadBalancerClass: "metallb.io/metallb", Namespace: "metallb-system",
				BGPAdvertisement: &guestnetv1.MetalLBBGPAdvertisement{Peers: []string{"tor"},
					Communities: &guestnetv1.BGPCommunities{Standard: []string{"65000:200"}}}}
			p.Spec.HostService.ExternalTrafficPolicies = []corev1.ServiceExternalTrafficPolicy{"Cluster", "Local"}
		}}, mutate...)...)
	}
	bgpGI := func(mutate ...func(*guestnetv1.GuestIngress)) *guestnetv1.GuestIngress {
		return gi(append([]func(*guestnetv1.GuestIngress){func(g *guestnetv1.GuestIngress) {
			g.Spec.LoadBalancer.Class = ingress.CiliumBGPClass
		}}, mutate...)...)
	}
	communities := func(c guestnetv1.BGPCommunities) func(*guestnetv1.GuestIngress) {
		return func(g *guestnetv1.GuestIngress) {
			if g.Spec.LoadBalancer.BGP == nil {
				g.Spec.LoadBalancer.BGP = &guestnetv1.BGPAnnouncementSpec{}
			}
			g.Spec.LoadBalancer.BGP.Communities = &c
		}
	}
	tests := []struct {
		name       string
		gi         *guestnetv1.GuestIngress
		policy     guestnetv1.GuestIngressPolicy
		wantMsg    []string
		check      func(g Gomega, d Decision)
		wantRefuse bool
	}{
		{name: "Cilium BGP with allowed communities, written in other forms, and an allowed label",
			gi: bgpGI(communities(guestnetv1.BGPCommunities{Standard: []string{"4259840100", "65535:65281"}, Large: []string{"64512:01:100"}}),
				func(g *guestnetv1.GuestIngress) {
					g.Spec.LoadBalancer.BGP.AdvertisementLabels = map[string]string{"bgp.example.com/upstream": "transit"}
				}),
			policy: bgpPolicy(),
			check: func(g Gomega, d Decision) {
				g.Expect(d.Announcer).To(Equal(ingress.AnnouncerCiliumBGP))
				g.Expect(d.BGP.AdvertisementLabels).To(Equal(map[string]string{"bgp.example.com/advertise": "tenants", "bgp.example.com/upstream": "transit"}))
				g.Expect(d.BGP.Communities.Standard).To(Equal([]string{"4259840100", "65535:65281"}))
			}},
		{name: "a community the policy does not list", policy: bgpPolicy(), wantRefuse: true,
			gi:      bgpGI(communities(guestnetv1.BGPCommunities{Standard: []string{"65000:666"}, WellKnown: []string{"blackhole"}})),
			wantMsg: []string{"BGP community 65000:666 (it allows 65000:100, no-export, 64512:1:100)", "BGP community blackhole"}},
		{name: "blackhole written as a number is blackhole", policy: bgpPolicy(), wantRefuse: true,
			gi:      bgpGI(communities(guestnetv1.BGPCommunities{Standard: []string{"4294902426"}})),
			wantMsg: []string{"BGP community 4294902426"}},
		{name: "an advertisement label the policy does not offer", policy: bgpPolicy(), wantRefuse: true,
			gi: bgpGI(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.BGP = &guestnetv1.BGPAnnouncementSpec{AdvertisementLabels: map[string]string{"bgp.example.com/upstream": "peering-ix"}}
			}),
			wantMsg: []string{"advertisement label bgp.example.com/upstream=peering-ix (it allows bgp.example.com/upstream=transit)"}},
		{name: "overriding the policy's own advertisement label", wantRefuse: true,
			policy: bgpPolicy(func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.BGPAdvertisement.AllowedAdvertisementLabels = []string{"bgp.example.com/advertise=infra"}
			}),
			gi: bgpGI(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.BGP = &guestnetv1.BGPAnnouncementSpec{AdvertisementLabels: map[string]string{"bgp.example.com/advertise": "infra"}}
			}),
			wantMsg: []string{"(the policy sets bgp.example.com/advertise itself)"}},
		{name: "guestnet's own marks as advertisement labels", wantRefuse: true,
			policy: bgpPolicy(func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.BGPAdvertisement.AllowedAdvertisementLabels = []string{"app.kubernetes.io/managed-by=guestnet"}
			}),
			gi: bgpGI(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.BGP = &guestnetv1.BGPAnnouncementSpec{AdvertisementLabels: map[string]string{"app.kubernetes.io/managed-by": "guestnet"}}
			}),
			wantMsg: []string{"(guestnet's own)"}},
		{name: "bgp with Cilium's L2 announcer", policy: pol("l2"), wantRefuse: true,
			gi:      gi(communities(guestnetv1.BGPCommunities{Standard: []string{"65000:100"}})),
			wantMsg: []string{"bgp with class io.cilium/l2-announcer"}},
		{name: "MetalLB: the policy's class, Local allowed", policy: metalLBPolicy(),
			gi: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Class = "metallb.io/metallb"
				g.Spec.LoadBalancer.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}, communities(guestnetv1.BGPCommunities{Standard: []string{"65000:200"}})),
			check: func(g Gomega, d Decision) {
				g.Expect(d.Announcer).To(Equal(ingress.AnnouncerMetalLB))
				g.Expect(d.MetalLB.Policy.BGPAdvertisement.Peers).To(Equal([]string{"tor"}))
				g.Expect(d.MetalLB.Communities.Standard).To(Equal([]string{"65000:200"}))
			}},
		{name: "MetalLB with a community its bgpAdvertisement does not allow", policy: metalLBPolicy(), wantRefuse: true,
			gi: gi(func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.Class = "metallb.io/metallb" },
				communities(guestnetv1.BGPCommunities{Standard: []string{"65000:100"}})),
			wantMsg: []string{"BGP community 65000:100 (it allows 65000:200)"}},
		{name: "MetalLB with a shared Cilium pool", policy: metalLBPolicy(func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} }),
			wantRefuse: true,
			gi: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Class = "metallb.io/metallb"
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.PoolRef = "", &guestnetv1.PoolReference{Name: "shared"}
			}),
			wantMsg: []string{"poolRef shared with MetalLB's class"}},
		{name: "dual-stack fixed IPs: each within the policy's ranges of its family", wantRefuse: true,
			policy: pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.Addresses = []string{"10.98.0.0/16", "2001:db8:98::/64"}
			}),
			gi: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.IPs = "", []string{"10.98.0.10", "2001:db8:99::10"}
			}),
			wantMsg: []string{"IP 2001:db8:99::10 (its addresses: 10.98.0.0/16, 2001:db8:98::/64)"}},
		{name: "dual-stack fixed IPs within the policy", policy: pol("p", func(p *guestnetv1.GuestIngressPolicy) {
			p.Spec.Addresses = []string{"10.98.0.0/16", "2001:db8:98::/64"}
		}),
			gi: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.IPs = "", []string{"10.98.0.10", "2001:db8:98::10"}
			}),
			check: func(g Gomega, d Decision) {
				g.Expect(d.Message).To(ContainSubstring("admits 10.98.0.10, 2001:db8:98::10"))
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			d := Admit(Input{GuestIngress: tt.gi, Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{tt.policy}})
			if tt.wantRefuse {
				g.Expect(d.Admitted).To(BeFalse())
				g.Expect(d.Reason).To(Equal(guestnetv1.NotAllowedReason))
			} else {
				g.Expect(d.Admitted).To(BeTrue(), d.Message)
			}
			for _, m := range tt.wantMsg {
				g.Expect(d.Message).To(ContainSubstring(m))
			}
			if tt.check != nil {
				tt.check(g, d)
			}
		})
	}
}

// What a BGP or MetalLB object holds stays within what the policy admits now: an
// advertisement with a community, a label or a Service the policy no longer allows goes.
func TestHeldAnnouncersWithinAdmitted(t *testing.T) {
	tenantA := namespace("tenant-a", map[string]string{"tenant": "a"})
	p := pol("bgp", func(p *guestnetv1.GuestIngressPolicy) {
		p.Spec.LoadBalancerClasses = []string{ingress.CiliumBGPClass}
		p.Spec.BGPAdvertisement = &guestnetv1.BGPAdvertisementPolicy{
			AdvertisementLabels: map[string]string{"advertise": "tenants"},
			Communities:         &guestnetv1.BGPCommunities{Standard: []string{"65000:100"}},
		}
	})
	g0 := gi(func(g *guestnetv1.GuestIngress) {
		g.Spec.LoadBalancer.Class = ingress.CiliumBGPClass
		g.Spec.LoadBalancer.BGP = &guestnetv1.BGPAnnouncementSpec{Communities: &guestnetv1.BGPCommunities{Standard: []string{"65000:100"}}}
	})
	in := Input{GuestIngress: g0, Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{p}}
	d := Admit(in)
	built, err := ingress.BuildAnnouncers(g0, d)
	if err != nil || built.CiliumBGPAdvertisement == nil {
		t.Fatalf("built %v, %v", built, err)
	}
	for name, tc := range map[string]struct {
		mutate     func(*unstructured.Unstructured, *guestnetv1.GuestIngressPolicy)
		wantDelete string
	}{
		"as built": {mutate: func(*unstructured.Unstructured, *guestnetv1.GuestIngressPolicy) {}},
		"community now denied": {mutate: func(_ *unstructured.Unstructured, p *guestnetv1.GuestIngressPolicy) {
			p.Spec.BGPAdvertisement.Communities = nil
		}, wantDelete: "not admitted"},
		"a community added by hand": {mutate: func(u *unstructured.Unstructured, _ *guestnetv1.GuestIngressPolicy) {
			_ = unstructured.SetNestedField(u.Object, []any{map[string]any{"advertisementType": "Service", "service": map[string]any{"addresses": []any{"LoadBalancerIP"}},
				"selector": ingress.ServiceSelector(g0), "attributes": map[string]any{"communities": map[string]any{"wellKnown": []any{"blackhole"}}}}}, "spec", "advertisements")
		}, wantDelete: "BGP community blackhole"},
		"selects every Service": {mutate: func(u *unstructured.Unstructured, _ *guestnetv1.GuestIngressPolicy) {
			_ = unstructured.SetNestedField(u.Object, []any{map[string]any{"advertisementType": "Service", "service": map[string]any{"addresses": []any{"LoadBalancerIP"}},
				"selector": map[string]any{}}}, "spec", "advertisements")
		}, wantDelete: "does not select Service tenant-a/guest-1-web alone"},
		"a label of another peer group": {mutate: func(u *unstructured.Unstructured, _ *guestnetv1.GuestIngressPolicy) {
			l := u.GetLabels()
			l["upstream"] = "ix"
			u.SetLabels(l)
		}, wantDelete: "label upstream=ix"},
		"the policy no longer announces with BGP": {mutate: func(_ *unstructured.Unstructured, p *guestnetv1.GuestIngressPolicy) { p.Spec.BGPAdvertisement = nil }},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			held := built.CiliumBGPAdvertisement.DeepCopy()
			policy := *p.DeepCopy()
			tc.mutate(held, &policy)
			in := Input{GuestIngress: g0, Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{policy}}
			ex := HeldBeyondAdmitted(in, Admit(in), Held{Announcers: ingress.AnnouncerObjects{CiliumBGPAdvertisement: held}})
			c := ex.Announcers[3]
			if tc.wantDelete == "" && name == "as built" {
				g.Expect(ex.None()).To(BeTrue(), "%v", c.Outside)
				return
			}
			g.Expect(c.Delete).To(BeTrue())
			g.Expect(strings.Join(c.Outside, "; ")).To(ContainSubstring(tc.wantDelete))
		})
	}
}

// A claim that overlaps a MetalLB pool of the platform is refused, whatever the policy: MetalLB
// would refuse its whole configuration, everyone's.
func TestAdmitRefusesMetalLBPoolOverlap(t *testing.T) {
	g := NewWithT(t)
	platform := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"addresses": []any{"10.98.0.8-10.98.0.12", "10.99.0.0/24"}}}}
	platform.SetGroupVersionKind(ingress.MetalLBPoolGVK)
	platform.SetName("infra-vips")
	platform.SetNamespace("metallb-system")
	tenantA := namespace("tenant-a", map[string]string{"tenant": "a"})
	d := Admit(Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")},
		MetalLBPools: []*unstructured.Unstructured{platform}})
	g.Expect(d.Admitted).To(BeFalse())
	g.Expect(d.Message).To(ContainSubstring("10.98.0.10/32 (it overlaps a MetalLB IPAddressPool of the platform"))
	g.Expect(d.Message).NotTo(ContainSubstring("infra-vips"), "the pool's name is the platform's")
	d = Admit(Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.IP = "10.98.0.13" }), Namespace: tenantA,
		Policies: []guestnetv1.GuestIngressPolicy{pol("p")}, MetalLBPools: []*unstructured.Unstructured{platform}})
	g.Expect(d.Admitted).To(BeTrue(), d.Message)
}
