package policy

import (
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
)

var created = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

func gi(mutate ...func(*guestnetv1.GuestIngress)) *guestnetv1.GuestIngress {
	g := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web", UID: "uid-web", CreationTimestamp: metav1.NewTime(created)},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  "guest-1",
			GuestService: guestnetv1.ObjectReference{Namespace: "projectcontour", Name: "envoy"},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: "10.98.0.10", Class: guestnetv1.DefaultLoadBalancerClass},
		},
	}
	for _, m := range mutate {
		m(g)
	}
	return g
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	l := map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

// pol is a policy for tenant=a namespaces: 10.98.0.0/16, Cilium's L2 announcer on ^eth0$ of
// nodes labelled lb=true, Cluster traffic only, nothing else.
func pol(name string, mutate ...func(*guestnetv1.GuestIngressPolicy)) guestnetv1.GuestIngressPolicy {
	p := guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector:   metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}},
			Addresses:           []string{"10.98.0.0/16"},
			LoadBalancerClasses: []string{guestnetv1.DefaultLoadBalancerClass},
			L2Announcement: &guestnetv1.L2AnnouncementPolicy{
				Interfaces:   []string{"^eth0$"},
				NodeSelector: metav1.LabelSelector{MatchLabels: map[string]string{"lb": "true"}},
			},
			HostService: guestnetv1.HostServicePolicy{ExternalTrafficPolicies: []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster}},
		},
	}
	for _, m := range mutate {
		m(&p)
	}
	return p
}

func ciliumPool(name string, selector map[string]any, blocks ...string) *unstructured.Unstructured {
	p := ingress.NewPool()
	p.SetName(name)
	var bs []any
	for _, b := range blocks {
		bs = append(bs, map[string]any{"cidr": b})
	}
	spec := map[string]any{"blocks": bs}
	if selector != nil {
		spec["serviceSelector"] = selector
	}
	p.Object["spec"] = spec
	return p
}

func byNamespace(ns ...string) map[string]any {
	vals := make([]any, len(ns))
	for i, n := range ns {
		vals[i] = n
	}
	return map[string]any{"matchExpressions": []any{map[string]any{"key": "io.kubernetes.service.namespace", "operator": "In", "values": vals}}}
}

func pools(ps ...*unstructured.Unstructured) PoolMap {
	m := map[string]*unstructured.Unstructured{}
	for _, p := range ps {
		m[p.GetName()] = p
	}
	return m
}

func sibling(name string, age time.Duration, mutate ...func(*guestnetv1.GuestIngress)) guestnetv1.GuestIngress {
	s := gi(mutate...)
	s.Name, s.UID = name, types.UID("uid-"+name)
	s.CreationTimestamp = metav1.NewTime(created.Add(-age))
	return *s
}

func TestAdmit(t *testing.T) {
	tenantA := namespace("tenant-a", map[string]string{"tenant": "a"})
	tests := []struct {
		name       string
		in         Input
		wantPolicy string // "" : not admitted
		wantReason string
		wantMsg    []string
		wantNotMsg []string
		// wantDetail: what the message leaves out, for the manager's log.
		wantDetail []string
		wantAnn    *ingress.Announcement
	}{
		// --- namespace selection ---------------------------------------------------------
		{
			name:       "no policy at all",
			in:         Input{GuestIngress: gi(), Namespace: tenantA},
			wantReason: guestnetv1.NoPolicyReason,
			wantMsg: []string{"No GuestIngressPolicy selects namespace tenant-a", "guestnet creates nothing on the host",
				"Ask the host admin for a GuestIngressPolicy that selects namespace tenant-a and allows 10.98.0.10"},
		},
		{
			name:       "the namespace cannot be read",
			in:         Input{GuestIngress: gi(), Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NoPolicyReason, wantMsg: []string{"could not read namespace tenant-a"},
		},
		{
			name:       "a policy that would allow it selects other namespaces",
			in:         Input{GuestIngress: gi(), Namespace: namespace("tenant-a", nil), Policies: []guestnetv1.GuestIngressPolicy{pol("team-a")}},
			wantReason: guestnetv1.NoPolicyReason,
			wantMsg: []string{"No GuestIngressPolicy selects namespace tenant-a",
				"A GuestIngressPolicy that does not select namespace tenant-a would allow it: ask the host admin to select the namespace"},
			wantNotMsg: []string{"Ask the host admin for a GuestIngressPolicy", "team-a", "tenant=a"},
			wantDetail: []string{"GuestIngressPolicy team-a would allow it but does not select namespace tenant-a (its namespaceSelector: tenant=a)"},
		},
		{
			name: "an invalid namespaceSelector selects nothing",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("broken", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.NamespaceSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tenant", Operator: "Near"}}}
			})}},
			wantReason: guestnetv1.NoPolicyReason,
		},
		{
			name: "{} selects every namespace",
			in: Input{GuestIngress: gi(), Namespace: namespace("tenant-a", nil), Policies: []guestnetv1.GuestIngressPolicy{pol("all", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.NamespaceSelector = metav1.LabelSelector{}
			})}},
			wantPolicy: "all",
		},

		// --- addresses --------------------------------------------------------------------
		{
			name:       "an IP in the policy's addresses",
			in:         Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantPolicy: "p", wantMsg: []string{"GuestIngressPolicy p admits 10.98.0.10"},
			wantAnn: &ingress.Announcement{Interfaces: []string{"^eth0$"}, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"lb": "true"}}},
		},
		{
			name:       "the host's API VIP",
			in:         Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.IP = "10.2.6.5" }), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg:    []string{"GuestIngressPolicy p does not allow IP 10.2.6.5 (its addresses: 10.98.0.0/16)", "guestnet creates nothing on the host"},
		},
		{
			name: "every address (0.0.0.0/0)",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"0.0.0.0/0"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"range 0.0.0.0/0 (its addresses: 10.98.0.0/16)"},
		},
		{
			name: "a range that only starts inside",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"10.98.0.0/15"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"range 10.98.0.0/15"},
		},
		{
			name: "one of two ranges outside",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"10.98.1.0/28", "10.99.0.0/28"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"range 10.99.0.0/28"}, wantNotMsg: []string{"10.98.1.0/28"},
		},
		{
			name: "an IPv6 address against IPv4 ranges",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.IP = "::ffff:10.98.0.10" }),
				Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"IP ::ffff:10.98.0.10"},
		},
		{
			name: "an IPv4-mapped IPv6 address, even in an IPv6 range of the policy",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.IP = "::ffff:10.98.0.10" }),
				Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
					p.Spec.Addresses = []string{"10.98.0.0/16", "::/1"}
				})}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"IP ::ffff:10.98.0.10 (an IPv4-mapped IPv6 address: write the IPv4 address)"},
		},
		{
			name: "an IPv6 range holding IPv4-mapped addresses",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"::ffff:10.98.0.0/120"}
			}),
				Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
					p.Spec.Addresses = []string{"::/1"}
				})}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"range ::ffff:10.98.0.0/120 (IPv4-mapped IPv6 addresses"},
		},
		{
			name: "a policy without addresses admits no ip or cidrs",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.Addresses = nil
			})}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"IP 10.98.0.10 (its addresses: none)"},
		},

		// --- classes and announcement -----------------------------------------------------
		{
			name: "a BGP class the policy does not list",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane" }),
				Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg:    []string{"loadBalancerClass io.cilium/bgp-control-plane (it allows io.cilium/l2-announcer)"},
		},
		{
			name: "a listed BGP class: no L2 announcement, no l2Announcement needed",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane"
				g.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^mgmt0$"}}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.LoadBalancerClasses = []string{"io.cilium/bgp-control-plane"}
				p.Spec.L2Announcement = nil
				p.Spec.BGPAdvertisement = &guestnetv1.BGPAdvertisementPolicy{AdvertisementLabels: map[string]string{"advertise": "tenants"}}
			})}},
			wantPolicy: "p", wantAnn: &ingress.Announcement{},
		},
		{
			name: "Cilium's BGP class without bgpAdvertisement in the policy",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane"
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.LoadBalancerClasses = []string{"io.cilium/bgp-control-plane"}
			})}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"announcing with io.cilium/bgp-control-plane (it has no bgpAdvertisement"},
		},
		{
			name: "the L2 announcer without l2Announcement in the policy",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.L2Announcement = nil
			})}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"announcing with io.cilium/l2-announcer (it has no l2Announcement"},
		},
		{
			name: "an empty class list means the L2 announcer only",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.Class = "metallb.io/metallb" }),
				Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.LoadBalancerClasses = nil })}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"loadBalancerClass metallb.io/metallb (it allows io.cilium/l2-announcer)"},
		},
		{
			name: "ARP on the management interface",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^mgmt0$"}}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"announcing on interface ^mgmt0$ (it allows ^eth0$)"},
		},
		{
			name: "a regular expression that matches more than the policy's is a different string",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"eth0"}}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"announcing on interface eth0 (it allows ^eth0$)"},
		},
		{
			name: "the tenant's interfaces, a subset of the policy's; node selectors ANDed",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{
					Interfaces:   []string{"^bond0$"},
					NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a", "lb": "false"}},
				}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.L2Announcement.Interfaces = []string{"^eth0$", "^bond0$"}
			})}},
			wantPolicy: "p",
			wantAnn: &ingress.Announcement{Interfaces: []string{"^bond0$"}, NodeSelector: &metav1.LabelSelector{
				MatchLabels:      map[string]string{"lb": "true", "zone": "a"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "lb", Operator: metav1.LabelSelectorOpIn, Values: []string{"false"}}},
			}},
		},
		{
			name: "no tenant interfaces: the policy's, never every interface",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.L2Announcement.NodeSelector = metav1.LabelSelector{}
			})}},
			wantPolicy: "p", wantAnn: &ingress.Announcement{Interfaces: []string{"^eth0$"}},
		},
		{
			name: "an invalid tenant node selector",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"the invalid spec.loadBalancer.l2.nodeSelector"},
		},
		{
			name: "a policy interface that is not a regular expression",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.L2Announcement.Interfaces = []string{"^eth(0$"}
			})}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"interface ^eth(0$, which is not a valid regular expression"},
		},

		// --- host Service metadata ---------------------------------------------------------
		{
			name: "annotations: none allowed by default",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Annotations = map[string]string{"external-dns.alpha.kubernetes.io/hostname": "www.bank.example"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg:    []string{"annotation external-dns.alpha.kubernetes.io/hostname (it allows none)"},
		},
		{
			name: "annotations by exact key and prefix",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Annotations = map[string]string{"example.com/team": "web", "team": "web"}
				g.Spec.LoadBalancer.Labels = map[string]string{"example.com/tier": "edge"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.AllowedAnnotationKeys = []string{"example.com/*", "team"}
				p.Spec.HostService.AllowedLabelKeys = []string{"example.com/tier"}
			})}},
			wantPolicy: "p",
		},
		{
			name: "a prefix entry does not allow a longer domain",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Annotations = map[string]string{"evil.example.com/x": "1"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.AllowedAnnotationKeys = []string{"example.com/*"}
			})}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"annotation evil.example.com/x (it allows example.com/*)"},
		},
		{
			// A policy object the API server would reject (CEL), as a Go caller could build it.
			name: "LB-IPAM's keys are refused even when a policy lists them",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Annotations = map[string]string{"lbipam.cilium.io/sharing-key": "victim", "lbipam.cilium.io/ips": "10.2.6.5"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.AllowedAnnotationKeys = []string{"lbipam.cilium.io/*"}
			})}},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg: []string{"annotation lbipam.cilium.io/ips (guestnet never passes it to a host Service)",
				"annotation lbipam.cilium.io/sharing-key (guestnet never passes it"},
		},
		{
			name: "a label an admin pool of another tenant selects",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Labels = map[string]string{"cluster.x-k8s.io/cluster-name": "victim", "pool": "tenant-b"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg:    []string{"label cluster.x-k8s.io/cluster-name (guestnet never passes it", "label pool (it allows none)"},
		},
		{
			name: "externalTrafficPolicy Local not allowed",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"externalTrafficPolicy Local (it allows Cluster; Local opens a health-check nodePort"},
		},
		{
			name: "externalTrafficPolicy Local allowed, announced with BGP",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
				g.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane"
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.ExternalTrafficPolicies = []corev1.ServiceExternalTrafficPolicy{"Cluster", "Local"}
				p.Spec.LoadBalancerClasses = []string{"io.cilium/bgp-control-plane"}
				p.Spec.BGPAdvertisement = &guestnetv1.BGPAdvertisementPolicy{AdvertisementLabels: map[string]string{"advertise": "tenants"}}
			})}},
			wantPolicy: "p", wantAnn: &ingress.Announcement{},
		},
		{
			name: "externalTrafficPolicy Local with Cilium's L2 announcer is refused, whatever the policy allows",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.ExternalTrafficPolicies = []corev1.ServiceExternalTrafficPolicy{"Cluster", "Local"}
			})}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"externalTrafficPolicy Local with Cilium's L2 announcer", "use a BGP or MetalLB class"},
		},
		{
			name: "no traffic policies listed means Cluster only",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.ExternalTrafficPolicies = nil
			})}},
			wantReason: guestnetv1.NotAllowedReason,
		},

		// --- shared pools -----------------------------------------------------------------
		{
			name: "poolRef to a pool the policy does not offer",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.PoolRef = "", &guestnetv1.PoolReference{Name: "infra"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")},
				Pools: pools(ciliumPool("infra", nil, "10.2.6.0/24"))},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"shared pool infra (it offers none)"},
		},
		{
			name: "poolRef to an offered pool that does not exist",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.PoolRef = "", &guestnetv1.PoolReference{Name: "shared"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} })}},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"shared pool shared, which does not exist"},
		},
		{
			name: "poolRef to an offered pool that selects by the cluster-name label",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.PoolRef = "", &guestnetv1.PoolReference{Name: "shared"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} })},
				Pools: pools(ciliumPool("shared", map[string]any{"matchLabels": map[string]any{"cluster.x-k8s.io/cluster-name": "guest-1"}}, "10.97.5.0/24"))},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"shared pool shared, whose serviceSelector does not select Services by namespace"},
		},
		{
			name: "poolRef with an IP outside the pool's blocks",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.PoolRef = "10.2.6.5", &guestnetv1.PoolReference{Name: "shared"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} })},
				Pools: pools(ciliumPool("shared", byNamespace("tenant-a"), "10.97.5.0/24"))},
			wantReason: guestnetv1.NotAllowedReason, wantMsg: []string{"IP 10.2.6.5, outside the blocks of shared pool shared"},
		},
		{
			// The shared pool is the grant: its IPs need not be in addresses.
			name: "poolRef with an IP in the offered, namespace-pinned pool",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.PoolRef = "10.97.5.7", &guestnetv1.PoolReference{Name: "shared"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} })},
				Pools: pools(ciliumPool("shared", byNamespace("tenant-a", "tenant-b"), "10.97.5.0/24"))},
			wantPolicy: "p", wantMsg: []string{"admits 10.97.5.7 from pool shared"},
		},
		{
			name: "poolRef without IP while a pool without selector could hand out the IP",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.PoolRef = "", &guestnetv1.PoolReference{Name: "shared"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} })},
				Pools: pools(ciliumPool("shared", byNamespace("tenant-a"), "10.97.5.0/24"), ciliumPool("default", nil, "192.168.0.0/24"))},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg:    []string{"while a pool of the platform selects its host Service and could hand it out"},
			wantNotMsg: []string{"default"},
			wantDetail: []string{"CiliumLoadBalancerIPPools that could hand out its IP: default (it has no serviceSelector, so it selects every Service)"},
		},

		// --- other pools that would select the host Service ---------------------------------
		{
			// The tenant names its cluster like the victim's: the victim's pool selects
			// guestnet's cluster-name label, which guestnet puts on every host Service.
			name: "cidrs while another tenant's pool selects the cluster-name label",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.ClusterName = "victim"
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"10.98.1.0/29"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")},
				Pools: pools(ciliumPool("victim", map[string]any{"matchLabels": map[string]any{"cluster.x-k8s.io/cluster-name": "victim"}}, "10.2.7.0/24"))},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg: []string{"while a pool of the platform selects its host Service and could hand it out",
				"set spec.loadBalancer.ip", "app.kubernetes.io/managed-by NotIn [guestnet]"},
			wantNotMsg: []string{"CiliumLoadBalancerIPPool victim"},
			wantDetail: []string{"victim (its serviceSelector selects the host Service)"},
		},
		{
			name: "a fixed IP is requested explicitly: other pools do not matter",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")},
				Pools: pools(ciliumPool("default", nil, "192.168.0.0/24"))},
			wantPolicy: "p",
		},
		{
			name: "cidrs; other pools: disabled, pinned elsewhere, guestnet's own, excluding guestnet",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"10.98.1.0/29"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p")},
				Pools: pools(
					func() *unstructured.Unstructured {
						p := ciliumPool("off", nil, "192.168.0.0/24")
						_ = unstructured.SetNestedField(p.Object, true, "spec", "disabled")
						return p
					}(),
					ciliumPool("tenant-b", byNamespace("tenant-b"), "10.97.6.0/24"),
					func() *unstructured.Unstructured {
						own := ingress.Pool(gi(func(g *guestnetv1.GuestIngress) {
							g.Spec.LoadBalancer.IP, g.Spec.LoadBalancer.CIDRs = "", []string{"10.98.1.0/29"}
						}))
						return own
					}(),
					ciliumPool("infra", map[string]any{"matchExpressions": []any{map[string]any{"key": "app.kubernetes.io/managed-by", "operator": "NotIn", "values": []any{"guestnet"}}}}, "10.1.0.0/24"),
				)},
			wantPolicy: "p",
		},

		// --- per-namespace cap ------------------------------------------------------------
		{
			name: "over the cap: the older one keeps its place",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.MaxGuestIngressesPerNamespace = ptr.To[int32](1)
			})}, Siblings: []guestnetv1.GuestIngress{*gi(), sibling("api", time.Hour)}},
			wantReason: guestnetv1.QuotaExceededReason,
			wantMsg: []string{"GuestIngressPolicy p admits at most 1 GuestIngresses in namespace tenant-a and admits the older api",
				"raise maxGuestIngressesPerNamespace"},
		},
		{
			name: "the cap counts only older GuestIngresses the policy allows",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.MaxGuestIngressesPerNamespace = ptr.To[int32](1)
			})}, Siblings: []guestnetv1.GuestIngress{
				sibling("refused", time.Hour, func(g *guestnetv1.GuestIngress) { g.Spec.LoadBalancer.IP = "10.2.6.5" }),
				sibling("newer", -time.Hour),
				func() guestnetv1.GuestIngress {
					s := sibling("elsewhere", time.Hour)
					s.Namespace = "tenant-b"
					return s
				}(),
			}},
			wantPolicy: "p",
		},
		{
			name: "same second: the name decides",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.MaxGuestIngressesPerNamespace = ptr.To[int32](1)
			})}, Siblings: []guestnetv1.GuestIngress{sibling("aaa", 0), sibling("zzz", 0)}},
			wantReason: guestnetv1.QuotaExceededReason, wantMsg: []string{"admits the older aaa"},
		},
		{
			name: "a cap of 0 admits nothing",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.MaxGuestIngressesPerNamespace = ptr.To[int32](0)
			})}},
			wantReason: guestnetv1.QuotaExceededReason,
		},
		{
			name: "over one policy's cap, admitted by another",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{
				pol("a", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.MaxGuestIngressesPerNamespace = ptr.To[int32](0) }),
				pol("b"),
			}},
			wantPolicy: "b",
		},

		// --- several policies -------------------------------------------------------------
		{
			name: "policies are not combined: one allows the range, another the annotation",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.Annotations = map[string]string{"example.com/team": "web"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{
				pol("ranges"),
				pol("keys", func(p *guestnetv1.GuestIngressPolicy) {
					p.Spec.Addresses = []string{"10.99.0.0/16"}
					p.Spec.HostService.AllowedAnnotationKeys = []string{"example.com/*"}
				}),
			}},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg: []string{"GuestIngressPolicy keys does not allow IP 10.98.0.10",
				"GuestIngressPolicy ranges does not allow annotation example.com/team (it allows none)"},
		},
		{
			name: "the first admitting policy by name",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{
				pol("zeta"), pol("beta", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.Addresses = []string{"10.99.0.0/16"} }), pol("alpha"),
			}},
			wantPolicy: "alpha",
		},
		{
			name: "a selecting policy refuses, a policy for other namespaces would allow",
			in: Input{GuestIngress: gi(), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{
				pol("tenants", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.Addresses = []string{"10.99.0.0/16"} }),
				pol("infra", func(p *guestnetv1.GuestIngressPolicy) {
					p.Spec.NamespaceSelector.MatchLabels = map[string]string{"infra": "true"}
				}),
			}},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg: []string{"GuestIngressPolicy tenants does not allow IP 10.98.0.10 (its addresses: 10.99.0.0/16)",
				"A GuestIngressPolicy that does not select namespace tenant-a would allow it"},
			wantNotMsg: []string{"infra"},
			wantDetail: []string{"GuestIngressPolicy infra would allow it but does not select namespace tenant-a (its namespaceSelector: infra=true)"},
		},
		{
			name: "messages stay bounded",
			in: Input{GuestIngress: gi(func(g *guestnetv1.GuestIngress) {
				g.Spec.LoadBalancer.IP = "10.2.6.5"
				g.Spec.LoadBalancer.Annotations = map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}
			}), Namespace: tenantA, Policies: []guestnetv1.GuestIngressPolicy{pol("p1"), pol("p2"), pol("p3"), pol("p4"), pol("p5")}},
			wantReason: guestnetv1.NotAllowedReason,
			wantMsg:    []string{"and 2 more policies", "and 2 more"},
			wantNotMsg: []string{"p4", "annotation c"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			d := Admit(tt.in)
			g.Expect(d.Admitted).To(Equal(tt.wantPolicy != ""), "%s: %s", d.Reason, d.Message)
			g.Expect(d.Policy).To(Equal(tt.wantPolicy))
			if tt.wantPolicy != "" {
				g.Expect(d.Reason).To(Equal(guestnetv1.AdmittedReason))
			} else {
				g.Expect(d.Reason).To(Equal(tt.wantReason), d.Message)
				g.Expect(d.Announcement).To(Equal(ingress.Announcement{}))
			}
			for _, m := range tt.wantMsg {
				g.Expect(d.Message).To(ContainSubstring(m))
			}
			for _, m := range tt.wantNotMsg {
				g.Expect(d.Message).NotTo(ContainSubstring(m))
			}
			for _, m := range tt.wantDetail {
				g.Expect(d.Detail).To(ContainSubstring(m))
			}
			if tt.wantAnn != nil {
				g.Expect(d.Announcement).To(Equal(*tt.wantAnn))
			}
			g.Expect(len(d.Message)).To(BeNumerically("<", 2048), "bounded message")

			// The same world in another order decides the same, to the letter.
			reversed := tt.in
			reversed.Policies = slices.Clone(tt.in.Policies)
			slices.Reverse(reversed.Policies)
			reversed.Siblings = slices.Clone(tt.in.Siblings)
			slices.Reverse(reversed.Siblings)
			g.Expect(Admit(reversed)).To(Equal(d))
		})
	}
}

// Every admitted GuestIngress announced by Cilium's L2 announcer has an announcement the
// builder accepts: interfaces named, and the policy's node requirements in its selector.
func TestAdmitAnnouncementIsBuildable(t *testing.T) {
	g := NewWithT(t)
	for _, ifaces := range [][]string{nil, {"^eth0$"}} {
		in := Input{GuestIngress: gi(func(x *guestnetv1.GuestIngress) {
			x.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{Interfaces: ifaces}
		}), Namespace: namespace("tenant-a", map[string]string{"tenant": "a"}), Policies: []guestnetv1.GuestIngressPolicy{pol("p")}}
		d := Admit(in)
		g.Expect(d.Admitted).To(BeTrue(), d.Message)
		l2, err := ingress.L2Policy(in.GuestIngress, d.Announcement)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(l2.Object["spec"]).To(HaveKeyWithValue("interfaces", []any{"^eth0$"}))
		g.Expect(l2.Object["spec"]).To(HaveKeyWithValue("nodeSelector", map[string]any{"matchLabels": map[string]any{"lb": "true"}}))
	}
}

func TestUsable(t *testing.T) {
	tests := []struct {
		name       string
		p          guestnetv1.GuestIngressPolicy
		pools      map[string]*unstructured.Unstructured
		wantReason string
		wantMsg    string
	}{
		{name: "as written", p: pol("p"), wantReason: guestnetv1.ReadyReason},
		{
			name: "invalid namespace selector",
			p: pol("p", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.NamespaceSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "x", Operator: "In"}}
			}),
			wantReason: guestnetv1.InvalidSelectorReason, wantMsg: "spec.namespaceSelector is invalid",
		},
		{
			name:       "interface not a regular expression",
			p:          pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.L2Announcement.Interfaces = []string{"eth[0"} }),
			wantReason: guestnetv1.InvalidInterfaceReason, wantMsg: "eth[0 is not a regular expression",
		},
		{
			name:       "shared pool missing",
			p:          pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} }),
			wantReason: guestnetv1.SharedPoolNotFoundReason, wantMsg: "CiliumLoadBalancerIPPool shared does not exist",
		},
		{
			name:       "shared pool a tenant could match",
			p:          pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} }),
			pools:      pools(ciliumPool("shared", map[string]any{"matchLabels": map[string]any{ownership.ClusterNameLabel: "tenant-a"}}, "10.97.0.0/24")),
			wantReason: guestnetv1.SharedPoolUnsafeReason, wantMsg: "matchLabels io.kubernetes.service.namespace",
		},
		{
			name:       "shared pool pinned to namespaces",
			p:          pol("p", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} }),
			pools:      pools(ciliumPool("shared", byNamespace("tenant-a"), "10.97.0.0/24")),
			wantReason: guestnetv1.ReadyReason,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			reason, msg := Usable(&tt.p, PoolMap(tt.pools))
			g.Expect(reason).To(Equal(tt.wantReason), msg)
			g.Expect(msg).To(ContainSubstring(tt.wantMsg))
		})
	}
}

func TestKeyAllowed(t *testing.T) {
	g := NewWithT(t)
	allowed := []string{"example.com/*", "team", "a.example.org/key"}
	for key, want := range map[string]bool{
		"example.com/team": true, "example.com/": true, "team": true, "a.example.org/key": true,
		"sub.example.com/team": false, "example.community/x": false, "teams": false, "a.example.org/other": false, "example.com": false,
	} {
		g.Expect(KeyAllowed(key, allowed)).To(Equal(want), key)
	}
	g.Expect(KeyAllowed("x", nil)).To(BeFalse())
	// "*" alone (which the API server rejects) allows nothing.
	g.Expect(KeyAllowed("x", []string{"*"})).To(BeFalse())
}

func TestSelectorAnd(t *testing.T) {
	g := NewWithT(t)
	g.Expect(SelectorAnd(&metav1.LabelSelector{}, nil)).To(BeNil())
	g.Expect(SelectorAnd(&metav1.LabelSelector{MatchLabels: map[string]string{"a": "1"}}, &metav1.LabelSelector{})).To(Equal(&metav1.LabelSelector{MatchLabels: map[string]string{"a": "1"}}))
	sel := SelectorAnd(&metav1.LabelSelector{MatchLabels: map[string]string{"a": "1"}}, &metav1.LabelSelector{MatchLabels: map[string]string{"a": "2", "b": "3"}})
	s, err := metav1.LabelSelectorAsSelector(sel)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.String()).To(Equal("a=1,a in (2),b=3"))
	g.Expect(strings.Contains(s.String(), "a=1")).To(BeTrue())
}

// claimant is an eligible GuestIngress that holds nothing on the host yet.
func claimant(gi *guestnetv1.GuestIngress) ingress.Claimant {
	return ingress.Claimant{GuestIngress: gi, Eligible: true}
}

// A poolRef IP is a claim like any other: another GuestIngress asking for the same IP (with
// or without poolRef, or a range holding it) is refused by the conflict check, whichever
// came with poolRef.
func TestPoolRefIPClaimsCountInConflicts(t *testing.T) {
	g := NewWithT(t)
	at := func(name string, age time.Duration, lb guestnetv1.LoadBalancerSpec) guestnetv1.GuestIngress {
		s := sibling(name, age)
		s.Spec.LoadBalancer = lb
		return s
	}
	shared := &guestnetv1.PoolReference{Name: "shared"}
	older := at("older", time.Hour, guestnetv1.LoadBalancerSpec{IP: "10.97.5.7", PoolRef: shared})
	for _, lb := range []guestnetv1.LoadBalancerSpec{
		{IP: "10.97.5.7", PoolRef: shared},
		{IP: "10.97.5.7"},
		{CIDRs: []string{"10.97.5.0/29"}},
	} {
		newer := at("newer", 0, lb)
		c := ingress.Contest(claimant(&newer), []ingress.Claimant{claimant(&older)})
		g.Expect(c).NotTo(BeNil(), "%+v", lb)
		g.Expect(c.Holder).To(Equal("tenant-a/older"))
	}
	// And the other way round: a poolRef IP inside an older GuestIngress's range.
	olderRange := at("older", time.Hour, guestnetv1.LoadBalancerSpec{CIDRs: []string{"10.97.5.0/29"}})
	newer := at("newer", 0, guestnetv1.LoadBalancerSpec{IP: "10.97.5.7", PoolRef: shared})
	c := ingress.Contest(claimant(&newer), []ingress.Claimant{claimant(&olderRange)})
	g.Expect(c).NotTo(BeNil())
	g.Expect(c.Reason).To(Equal(guestnetv1.IPConflictReason))
}
