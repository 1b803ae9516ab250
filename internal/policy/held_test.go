package policy

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

// heldCase is a GuestIngress, the policies of its namespace and what its host objects hold:
// by default, exactly what guestnet builds for it under the policy heldPolicy (before the
// case's changes), with the IP assigned.
type heldCase struct {
	name string
	// spec changes the GuestIngress as it is now (after its objects were built).
	spec func(*guestnetv1.GuestIngress)
	// built changes the GuestIngress the objects were built from, builtPolicy the policy
	// that admitted it then.
	built       func(*guestnetv1.GuestIngress)
	builtPolicy func(*guestnetv1.GuestIngressPolicy)
	// policy changes the admitting policy as it is now; noPolicy deletes it.
	policy   func(*guestnetv1.GuestIngressPolicy)
	noPolicy bool
	// held changes the held objects.
	held func(*Held)

	// What is expected of each object: nil: within; else the cut.
	wantService, wantPool, wantL2 *wantCut
}

type wantCut struct {
	outside []string // substrings, one per phrase, in order
	delete  bool
	// check inspects the narrowed object.
	checkService func(Gomega, *corev1.Service)
	checkObject  func(Gomega, *unstructured.Unstructured)
}

// heldPolicy admits tenant-a's GuestIngresses: 10.98.0.0/16, the L2 announcer on ^eth0$ and
// ^eth1$ of nodes labelled lb=true, annotations and labels example.com/*, Cluster traffic.
func heldPolicy(mutate ...func(*guestnetv1.GuestIngressPolicy)) guestnetv1.GuestIngressPolicy {
	return pol("tenants", append([]func(*guestnetv1.GuestIngressPolicy){func(p *guestnetv1.GuestIngressPolicy) {
		p.Spec.L2Announcement.Interfaces = []string{"^eth0$", "^eth1$"}
		p.Spec.HostService.AllowedAnnotationKeys = []string{"example.com/*"}
		p.Spec.HostService.AllowedLabelKeys = []string{"example.com/*"}
	}}, mutate...)...)
}

// heldGuestIngress asks for 10.98.0.10, names no interface, and carries an annotation and a
// label the policy allows. It is paused: pause makes no difference to what it may hold.
func heldGuestIngress() *guestnetv1.GuestIngress {
	return gi(func(g *guestnetv1.GuestIngress) {
		g.Labels = map[string]string{clusterv1.WatchLabel: "shard-1"}
		g.Annotations = map[string]string{clusterv1.PausedAnnotation: "true"}
		g.Spec.Ports = []guestnetv1.IngressPort{{Name: "http", Port: 80}}
		g.Spec.LoadBalancer.Annotations = map[string]string{"example.com/team": "web"}
		g.Spec.LoadBalancer.Labels = map[string]string{"example.com/tier": "edge"}
	})
}

// build returns what guestnet applies for gi when p admits it, the host Service with the IP
// LB-IPAM assigned.
func build(g Gomega, gi *guestnetv1.GuestIngress, p guestnetv1.GuestIngressPolicy, ps ...*unstructured.Unstructured) Held {
	d := Admit(Input{GuestIngress: gi, Namespace: namespace(gi.Namespace, map[string]string{"tenant": "a"}), Policies: []guestnetv1.GuestIngressPolicy{p},
		Pools: pools(ps...)})
	g.Expect(d.Admitted).To(BeTrue(), d.Message)
	l2, err := ingress.L2Policy(gi, d.Announcement)
	g.Expect(err).NotTo(HaveOccurred())
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ingress.HostService(gi, map[string]int32{"http": 30080}, ingress.Admission{}))
	g.Expect(err).NotTo(HaveOccurred())
	svc := &corev1.Service{}
	g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(raw, svc)).To(Succeed())
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: gi.Spec.LoadBalancer.IP}}
	pool := ingress.Pool(gi)
	return Held{HostService: svc, Pool: pool, L2Policy: l2}
}

func TestHeldBeyondAdmitted(t *testing.T) {
	tests := []heldCase{
		{name: "as built, paused: everything is admitted"},
		{name: "the spec changed within the policy while paused: what is held stays (no new changes)",
			spec: func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP = "10.98.0.11"
				g.Spec.LoadBalancer.Annotations = nil
			}},

		// --- not admitted: everything goes ---------------------------------------------
		{name: "the policy is deleted", noPolicy: true,
			wantService: &wantCut{outside: []string{"everything: the GuestIngress is not admitted (NoPolicy)"}, delete: true},
			wantPool:    &wantCut{outside: []string{"not admitted (NoPolicy)"}, delete: true},
			wantL2:      &wantCut{outside: []string{"not admitted (NoPolicy)"}, delete: true}},
		{name: "the policy is narrowed so that it no longer admits the GuestIngress",
			policy:      func(p *guestnetv1.GuestIngressPolicy) { p.Spec.Addresses = []string{"10.98.1.0/24"} },
			wantService: &wantCut{outside: []string{"not admitted (NotAllowed)"}, delete: true},
			wantPool:    &wantCut{outside: []string{"not admitted (NotAllowed)"}, delete: true},
			wantL2:      &wantCut{outside: []string{"not admitted (NotAllowed)"}, delete: true}},
		{name: "an annotation key is no longer allowed and the spec still carries it",
			policy:      func(p *guestnetv1.GuestIngressPolicy) { p.Spec.HostService.AllowedAnnotationKeys = nil },
			wantService: &wantCut{outside: []string{"not admitted (NotAllowed)"}, delete: true},
			wantPool:    &wantCut{delete: true, outside: []string{"not admitted"}},
			wantL2:      &wantCut{delete: true, outside: []string{"not admitted"}}},

		// --- admitted, but objects of an earlier spec reach beyond the narrowed policy ----
		{name: "addresses narrowed to the new spec's IP: the old pool, IP request and IP go",
			built:  func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.IP = "10.98.0.10" },
			spec:   func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.IP = "10.98.1.20" },
			policy: func(p *guestnetv1.GuestIngressPolicy) { p.Spec.Addresses = []string{"10.98.1.0/24"} },
			wantService: &wantCut{delete: true, outside: []string{
				"load-balancer IP 10.98.0.10 (GuestIngressPolicy tenants allows 10.98.1.0/24)",
				"IP request 10.98.0.10 (annotation lbipam.cilium.io/ips; GuestIngressPolicy tenants allows 10.98.1.0/24)"}},
			wantPool: &wantCut{delete: true, outside: []string{"block 10.98.0.10/32 of CiliumLoadBalancerIPPool tenant-a.guest-1-web (GuestIngressPolicy tenants allows 10.98.1.0/24)"}}},
		{name: "one block of two outside: the pool is narrowed to the other",
			built: func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"10.98.0.8/29", "10.98.2.0/29"}
			},
			spec: func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"10.98.0.8/29"}
			},
			held: func(h *Held) { h.HostService.Status.LoadBalancer.Ingress[0].IP = "10.98.0.9" },
			policy: func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.Addresses = []string{"10.98.0.0/24"}
			},
			wantPool: &wantCut{outside: []string{"block 10.98.2.0/29"}, checkObject: func(g Gomega, u *unstructured.Unstructured) {
				g.Expect(u.Object["spec"]).To(HaveKeyWithValue("blocks", []any{map[string]any{"cidr": "10.98.0.8/29"}}))
			}}},
		{name: "a block partly outside is dropped whole",
			built: func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "10.98.0.10", []string{"10.98.0.0/23"}
			},
			spec:     func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.CIDRs = []string{"10.98.0.0/24"} },
			policy:   func(p *guestnetv1.GuestIngressPolicy) { p.Spec.Addresses = []string{"10.98.0.0/24"} },
			wantPool: &wantCut{delete: true, outside: []string{"block 10.98.0.0/23"}}},
		{name: "a pool block written as start and stop is judged as a range",
			held: func(h *Held) {
				h.Pool.Object["spec"].(map[string]any)["blocks"] = []any{
					map[string]any{"start": "10.98.0.10", "stop": "10.98.0.12"},
					map[string]any{"start": "10.98.255.250", "stop": "10.99.0.1"},
					map[string]any{"start": "not-an-ip"},
				}
			},
			wantPool: &wantCut{outside: []string{"block 10.98.255.250-10.99.0.1", "block not-an-ip-<nil>"}, checkObject: func(g Gomega, u *unstructured.Unstructured) {
				g.Expect(u.Object["spec"]).To(HaveKeyWithValue("blocks", []any{map[string]any{"start": "10.98.0.10", "stop": "10.98.0.12"}}))
			}}},
		{name: "a pool's serviceSelector that selects more than the host Service is pinned again",
			held: func(h *Held) {
				h.Pool.Object["spec"].(map[string]any)["serviceSelector"] = map[string]any{"matchLabels": map[string]any{ingress.ServiceNamespaceKey: "tenant-a"}}
			},
			wantPool: &wantCut{outside: []string{"the serviceSelector of CiliumLoadBalancerIPPool tenant-a.guest-1-web, which does not select Service tenant-a/guest-1-web alone"},
				checkObject: func(g Gomega, u *unstructured.Unstructured) {
					g.Expect(u.Object["spec"]).To(HaveKeyWithValue("serviceSelector", ingress.ServiceSelector(heldGuestIngress())))
				}}},

		// --- the L2 announcement -------------------------------------------------------
		{name: "an interface is no longer allowed: the announcement is narrowed to the others",
			policy: func(p *guestnetv1.GuestIngressPolicy) { p.Spec.L2Announcement.Interfaces = []string{"^eth0$"} },
			wantL2: &wantCut{outside: []string{"announcing on interface ^eth1$ (GuestIngressPolicy tenants allows ^eth0$)"}, checkObject: func(g Gomega, u *unstructured.Unstructured) {
				g.Expect(u.Object["spec"]).To(HaveKeyWithValue("interfaces", []any{"^eth0$"}))
				g.Expect(u.Object["spec"]).To(HaveKeyWithValue("nodeSelector", map[string]any{"matchLabels": map[string]any{"lb": "true"}}))
			}}},
		{name: "no interface is allowed any more: the announcement goes",
			policy: func(p *guestnetv1.GuestIngressPolicy) { p.Spec.L2Announcement.Interfaces = []string{"^bond0$"} },
			wantL2: &wantCut{delete: true, outside: []string{"interface ^eth0$", "interface ^eth1$"}}},
		{name: "an announcement on every interface (none listed) goes",
			held:   func(h *Held) { unstructured.RemoveNestedField(h.L2Policy.Object, "spec", "interfaces") },
			wantL2: &wantCut{delete: true, outside: []string{"announcing on every interface (GuestIngressPolicy tenants allows ^eth0$, ^eth1$)"}}},
		{name: "the policy's node selector narrowed: ANDed into the announcement's",
			policy: func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.L2Announcement.NodeSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a"}}}
			},
			wantL2: &wantCut{outside: []string{"announcing from nodes outside the nodeSelector lb=true,zone in (a) of GuestIngressPolicy tenants"},
				checkObject: func(g Gomega, u *unstructured.Unstructured) {
					sel, _, _ := unstructured.NestedMap(u.Object, "spec", "nodeSelector")
					g.Expect(sel).To(Equal(map[string]any{
						"matchLabels":      map[string]any{"lb": "true"},
						"matchExpressions": []any{map[string]any{"key": "zone", "operator": "In", "values": []any{"a"}}},
					}))
				}}},
		{name: "an announcement from every node goes back to the policy's",
			held: func(h *Held) { unstructured.RemoveNestedField(h.L2Policy.Object, "spec", "nodeSelector") },
			wantL2: &wantCut{outside: []string{"announcing from nodes outside the nodeSelector lb=true"}, checkObject: func(g Gomega, u *unstructured.Unstructured) {
				g.Expect(u.Object["spec"]).To(HaveKeyWithValue("nodeSelector", map[string]any{"matchLabels": map[string]any{"lb": "true"}}))
			}}},
		{name: "external IPs are never announced",
			held: func(h *Held) { h.L2Policy.Object["spec"].(map[string]any)["externalIPs"] = true },
			wantL2: &wantCut{outside: []string{"announcing external IPs"}, checkObject: func(g Gomega, u *unstructured.Unstructured) {
				g.Expect(u.Object["spec"]).NotTo(HaveKey("externalIPs"))
				g.Expect(u.Object["spec"]).To(HaveKeyWithValue("loadBalancerIPs", true))
			}}},
		{name: "an L2 policy whose serviceSelector is not pinned is pinned again",
			held: func(h *Held) { h.L2Policy.Object["spec"].(map[string]any)["serviceSelector"] = map[string]any{} },
			wantL2: &wantCut{outside: []string{"the serviceSelector of CiliumL2AnnouncementPolicy"}, checkObject: func(g Gomega, u *unstructured.Unstructured) {
				g.Expect(u.Object["spec"]).To(HaveKeyWithValue("serviceSelector", ingress.ServiceSelector(heldGuestIngress())))
			}}},
		{name: "the policy allows no L2 announcement any more (BGP only): the announcement goes",
			spec: func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane" },
			policy: func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.LoadBalancerClasses, p.Spec.L2Announcement = []string{"io.cilium/bgp-control-plane"}, nil
				p.Spec.BGPAdvertisement = &guestnetv1.BGPAdvertisementPolicy{AdvertisementLabels: map[string]string{"advertise": "tenants"}}
			},
			wantL2:      &wantCut{delete: true, outside: []string{"GuestIngressPolicy tenants allows no announcement with io.cilium/l2-announcer"}},
			wantService: &wantCut{delete: true, outside: []string{`loadBalancerClass "io.cilium/l2-announcer" (GuestIngressPolicy tenants allows io.cilium/bgp-control-plane)`}}},

		// --- the host Service ------------------------------------------------------------
		{name: "externalTrafficPolicy Local, no longer allowed, becomes Cluster",
			built: func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				g.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane"
			},
			builtPolicy: func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.ExternalTrafficPolicies = []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyLocal}
				p.Spec.LoadBalancerClasses = []string{"io.cilium/bgp-control-plane"}
				p.Spec.BGPAdvertisement = &guestnetv1.BGPAdvertisementPolicy{AdvertisementLabels: map[string]string{"advertise": "tenants"}}
			},
			policy: func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.LoadBalancerClasses = []string{"io.cilium/bgp-control-plane"}
				p.Spec.BGPAdvertisement = &guestnetv1.BGPAdvertisementPolicy{AdvertisementLabels: map[string]string{"advertise": "tenants"}}
			},
			spec: func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.ExternalTrafficPolicy = ""
				g.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane"
			},
			held: func(h *Held) { h.HostService.Spec.HealthCheckNodePort = 31999 },
			wantService: &wantCut{outside: []string{"externalTrafficPolicy Local"}, checkService: func(g Gomega, s *corev1.Service) {
				g.Expect(s.Spec.ExternalTrafficPolicy).To(Equal(corev1.ServiceExternalTrafficPolicyCluster))
				g.Expect(s.Spec.HealthCheckNodePort).To(BeZero())
			}}},
		{name: "annotations and labels the tenant added by hand, or the policy no longer allows, are removed",
			held: func(h *Held) {
				h.HostService.Annotations["external-dns.alpha.kubernetes.io/hostname"] = "www.bank.example"
				h.HostService.Annotations["lbipam.cilium.io/sharing-key"] = "victim"
				h.HostService.Annotations["io.cilium/lb-ipam-ips"] = "10.97.0.1"
				h.HostService.Labels["example.com/pool"] = "infra"
				h.HostService.Labels["team"] = "web"
				h.HostService.Labels["service.kubernetes.io/service-proxy-name"] = "none"
			},
			policy: func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.AllowedLabelKeys = []string{"example.com/tier"}
			},
			wantService: &wantCut{outside: []string{
				"annotation external-dns.alpha.kubernetes.io/hostname (GuestIngressPolicy tenants allows example.com/*)",
				"annotation io.cilium/lb-ipam-ips (guestnet never passes it to a host Service)",
				"annotation lbipam.cilium.io/sharing-key (guestnet never passes it to a host Service)",
				"label example.com/pool (GuestIngressPolicy tenants allows example.com/tier)",
				"label service.kubernetes.io/service-proxy-name (guestnet never passes it to a host Service)",
				"label team (GuestIngressPolicy tenants allows example.com/tier)",
			}, checkService: func(g Gomega, s *corev1.Service) {
				g.Expect(s.Annotations).To(Equal(map[string]string{
					"example.com/team": "web", "lbipam.cilium.io/ips": "10.98.0.10", ownership.WatchFilterAnnotation: "shard-1"}))
				g.Expect(s.Labels).To(Equal(ingress.HostServiceLabels(heldGuestIngress())))
			}}},
		{name: "IP requests outside the addresses are removed, those inside stay",
			held: func(h *Held) {
				h.HostService.Annotations[ingress.LBIPAMIPsAnnotation] = "10.98.0.10, 10.97.0.1"
				h.HostService.Spec.LoadBalancerIP = "10.97.0.2"
				h.HostService.Spec.ExternalIPs = []string{"10.97.0.3"}
			},
			wantService: &wantCut{outside: []string{
				"externalIPs 10.97.0.3 (guestnet sets none)",
				"spec.loadBalancerIP 10.97.0.2 (GuestIngressPolicy tenants allows 10.98.0.0/16)",
				"IP request 10.97.0.1 (annotation lbipam.cilium.io/ips; GuestIngressPolicy tenants allows 10.98.0.0/16)",
			}, checkService: func(g Gomega, s *corev1.Service) {
				g.Expect(s.Annotations).To(HaveKeyWithValue(ingress.LBIPAMIPsAnnotation, "10.98.0.10"))
				g.Expect(s.Spec.LoadBalancerIP).To(BeEmpty())
				g.Expect(s.Spec.ExternalIPs).To(BeEmpty())
			}}},
		{name: "an IP request with nothing inside is removed whole",
			held: func(h *Held) { h.HostService.Annotations[ingress.LBIPAMIPsAnnotation] = "10.97.0.1" },
			wantService: &wantCut{outside: []string{"IP request 10.97.0.1"}, checkService: func(g Gomega, s *corev1.Service) {
				g.Expect(s.Annotations).NotTo(HaveKey(ingress.LBIPAMIPsAnnotation))
			}}},
		{name: "guestnet's own labels get their values back (an admin pool selecting by cluster name)",
			held: func(h *Held) { h.HostService.Labels[ownership.ClusterNameLabel] = "victim" },
			wantService: &wantCut{outside: []string{"label cluster.x-k8s.io/cluster-name=victim (guestnet's own label, which is guest-1)"},
				checkService: func(g Gomega, s *corev1.Service) {
					g.Expect(s.Labels).To(HaveKeyWithValue(ownership.ClusterNameLabel, "guest-1"))
				}}},
		{name: "a host Service made NodePort, or with nodePorts, goes",
			held: func(h *Held) {
				h.HostService.Spec.Type = corev1.ServiceTypeNodePort
				h.HostService.Spec.Ports[0].NodePort = 30080
			},
			wantService: &wantCut{delete: true, outside: []string{"type NodePort", "nodePort 30080 of port http"}}},
		{name: "a class the policy no longer allows cannot be changed in place: the host Service goes",
			policy: func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.LoadBalancerClasses = []string{"io.cilium/bgp-control-plane"}
				p.Spec.BGPAdvertisement = &guestnetv1.BGPAdvertisementPolicy{AdvertisementLabels: map[string]string{"advertise": "tenants"}}
			},
			spec:        func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane" },
			wantService: &wantCut{delete: true, outside: []string{`loadBalancerClass "io.cilium/l2-announcer"`}},
			wantL2:      &wantCut{delete: true, outside: []string{"allows no announcement with io.cilium/l2-announcer"}}},
		{name: "between two classes (ClusterIP) the host Service is fine",
			held: func(h *Held) {
				h.HostService.Spec.Type, h.HostService.Spec.LoadBalancerClass = corev1.ServiceTypeClusterIP, nil
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			built := heldGuestIngress()
			if tc.built != nil {
				tc.built(built)
			}
			then := heldPolicy()
			if tc.builtPolicy != nil {
				tc.builtPolicy(&then)
			}
			held := build(g, built, then)
			if tc.held != nil {
				tc.held(&held)
			}
			before := Held{HostService: held.HostService.DeepCopy(), Pool: held.Pool.DeepCopy(), L2Policy: held.L2Policy.DeepCopy()}

			now := built.DeepCopy()
			if tc.spec != nil {
				tc.spec(now)
			}
			var policies []guestnetv1.GuestIngressPolicy
			if !tc.noPolicy {
				p := heldPolicy()
				if tc.policy != nil {
					tc.policy(&p)
				}
				policies = append(policies, p)
			}
			in := Input{GuestIngress: now, Namespace: namespace(now.Namespace, map[string]string{"tenant": "a"}), Policies: policies}
			e := HeldBeyondAdmitted(in, Admit(in), held)

			expectCut(g, "host Service", e.HostService, tc.wantService, func(w *wantCut, n *corev1.Service) {
				if w.checkService != nil {
					w.checkService(g, n)
				}
			})
			expectCut(g, "pool", e.Pool, tc.wantPool, func(w *wantCut, n *unstructured.Unstructured) {
				if w.checkObject != nil {
					w.checkObject(g, n)
				}
			})
			expectCut(g, "L2 policy", e.L2Policy, tc.wantL2, func(w *wantCut, n *unstructured.Unstructured) {
				if w.checkObject != nil {
					w.checkObject(g, n)
				}
			})
			g.Expect(e.None()).To(Equal(tc.wantService == nil && tc.wantPool == nil && tc.wantL2 == nil))
			g.Expect(held).To(Equal(before), "the held objects are never changed")

			// What is left after the cut is within what is admitted.
			left := Held{}
			if !e.HostService.Delete {
				left.HostService = cmpOrObj(e.HostService.Narrowed, held.HostService)
			}
			if !e.Pool.Delete {
				left.Pool = cmpOrObj(e.Pool.Narrowed, held.Pool)
			}
			if !e.L2Policy.Delete {
				left.L2Policy = cmpOrObj(e.L2Policy.Narrowed, held.L2Policy)
			}
			g.Expect(HeldBeyondAdmitted(in, Admit(in), left).None()).To(BeTrue(), "what is left is within")
		})
	}
}

func cmpOrObj[T comparable](narrowed, held T) T {
	var zero T
	if narrowed != zero {
		return narrowed
	}
	return held
}

func expectCut[T comparable](g Gomega, what string, got Cut[T], want *wantCut, check func(*wantCut, T)) {
	var zero T
	if want == nil {
		g.Expect(got.Outside).To(BeEmpty(), "%s: nothing outside", what)
		g.Expect(got.Delete).To(BeFalse(), what)
		g.Expect(got.Narrowed).To(Equal(zero), what)
		return
	}
	g.Expect(got.Outside).To(HaveLen(len(want.outside)), "%s: %q", what, got.Outside)
	for i, s := range want.outside {
		g.Expect(got.Outside[i]).To(ContainSubstring(s), what)
	}
	g.Expect(got.Delete).To(Equal(want.delete), "%s: delete", what)
	if want.delete {
		g.Expect(got.Narrowed).To(Equal(zero), what)
		return
	}
	g.Expect(got.Narrowed).NotTo(Equal(zero), "%s: narrowed", what)
	check(want, got.Narrowed)
}

// A GuestIngress that takes its IP from an admitted shared pool may request and hold an IP of
// that pool, and nothing else.
func TestHeldBeyondAdmittedSharedPool(t *testing.T) {
	g := NewWithT(t)
	shared := ciliumPool("shared", byNamespace("tenant-a"), "10.50.0.0/28")
	p := heldPolicy(func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} })
	web := heldGuestIngress()
	web.Spec.LoadBalancer.IP, web.Spec.LoadBalancer.PoolRef = "10.50.0.5", &guestnetv1.PoolReference{Name: "shared"}
	in := Input{GuestIngress: web, Namespace: namespace("tenant-a", map[string]string{"tenant": "a"}), Policies: []guestnetv1.GuestIngressPolicy{p},
		Pools: pools(shared)}
	d := Admit(in)
	g.Expect(d.Admitted).To(BeTrue(), d.Message)
	held := build(g, web, p, shared)
	g.Expect(held.Pool).To(BeNil(), "no pool of its own with poolRef")
	g.Expect(HeldBeyondAdmitted(in, d, held).None()).To(BeTrue())

	held.HostService.Annotations[ingress.LBIPAMIPsAnnotation] = "10.50.0.5,10.50.1.5"
	e := HeldBeyondAdmitted(in, d, held)
	g.Expect(e.HostService.Outside).To(ConsistOf(ContainSubstring("IP request 10.50.1.5")))
	g.Expect(e.HostService.Narrowed.Annotations).To(HaveKeyWithValue(ingress.LBIPAMIPsAnnotation, "10.50.0.5"))

	// The pool is no longer offered: not admitted, everything goes.
	in.Policies[0].Spec.SharedPools = nil
	d = Admit(in)
	g.Expect(d.Admitted).To(BeFalse())
	g.Expect(HeldBeyondAdmitted(in, d, held).HostService.Delete).To(BeTrue())
}

// A decision that names a policy the input does not hold admits nothing to hold (fail
// closed); a decision without held objects cuts nothing.
func TestHeldBeyondAdmittedFailsClosed(t *testing.T) {
	g := NewWithT(t)
	web := heldGuestIngress()
	held := build(g, web, heldPolicy())
	in := Input{GuestIngress: web, Namespace: namespace("tenant-a", map[string]string{"tenant": "a"})}
	e := HeldBeyondAdmitted(in, Decision{Admitted: true, Policy: "gone"}, held)
	g.Expect(e.HostService.Delete && e.Pool.Delete && e.L2Policy.Delete).To(BeTrue())
	g.Expect(e.Pool.Outside).To(ConsistOf("everything: GuestIngressPolicy gone, said to admit it, is not there"))
	g.Expect(HeldBeyondAdmitted(in, Decision{Reason: guestnetv1.NoPolicyReason}, Held{}).None()).To(BeTrue())
}

func TestSelectorWithin(t *testing.T) {
	lb := &metav1.LabelSelector{MatchLabels: map[string]string{"lb": "true"}}
	zone := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}
	for _, tc := range []struct {
		name        string
		held, bound *metav1.LabelSelector
		want        bool
	}{
		{"an empty bound holds everything", nil, &metav1.LabelSelector{}, true},
		{"every node is not within lb=true", nil, lb, false},
		{"the same", lb, lb, true},
		{"narrower", SelectorAnd(lb, zone), lb, true},
		{"narrower, the other way round", SelectorAnd(zone, lb), zone, true},
		{"another value", &metav1.LabelSelector{MatchLabels: map[string]string{"lb": "false"}}, lb, false},
		{"another set of values", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "c"}}}}, zone, false},
		{"a held selector that does not parse", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "zone", Operator: "Near"}}}, lb, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			NewWithT(t).Expect(SelectorWithin(tc.held, tc.bound)).To(Equal(tc.want))
		})
	}
}
