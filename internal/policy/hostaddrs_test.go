package policy

import (
	"net/netip"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostaddrs"
)

// hostSet: the host's apiserver at 10.98.0.1, a Node at 10.98.3.7 with pod CIDR
// 10.98.64.0/24, the Service network 10.98.128.0/20: all inside pol's 10.98.0.0/16.
func hostSet() hostaddrs.Set {
	return hostaddrs.New(
		hostaddrs.Entry{Kind: hostaddrs.APIServer, Prefix: netip.MustParsePrefix("10.98.0.1/32")},
		hostaddrs.Entry{Kind: hostaddrs.NodeAddress, Prefix: netip.MustParsePrefix("10.98.3.7/32")},
		hostaddrs.Entry{Kind: hostaddrs.PodCIDR, Prefix: netip.MustParsePrefix("10.98.64.0/24")},
		hostaddrs.Entry{Kind: hostaddrs.ServiceCIDR, Prefix: netip.MustParsePrefix("10.98.128.0/20")},
	)
}

func TestAdmitRefusesHostAddresses(t *testing.T) {
	shared := ciliumPool("shared", map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": "tenant-a"}}, "10.98.3.0/24")
	tests := []struct {
		name     string
		lb       func(*guestnetv1.LoadBalancerSpec)
		policy   func(*guestnetv1.GuestIngressPolicy)
		wantKind string // "" when admitted
	}{
		{name: "an address beside the host's is admitted", lb: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP = "10.98.3.8" }},
		{name: "the apiserver's address", lb: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP = "10.98.0.1" },
			wantKind: "an address of the host apiserver"},
		{name: "a Node's address", lb: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP = "10.98.3.7" }, wantKind: "a host Node's address"},
		{name: "an address of a Node's pod CIDR", lb: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP = "10.98.64.200" },
			wantKind: "in the host's pod network"},
		{name: "an address of the Service network", lb: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP = "10.98.130.1" },
			wantKind: "in the host's Service network"},
		{name: "a CIDR that holds a Node's address is refused as a whole",
			lb:       func(lb *guestnetv1.LoadBalancerSpec) { lb.IP, lb.CIDRs = "", []string{"10.98.4.0/24", "10.98.0.0/22"} },
			wantKind: "a host Node's address"},
		{name: "a CIDR beside the host's addresses is admitted",
			lb: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP, lb.CIDRs = "", []string{"10.98.4.0/24"} }},
		{name: "a range an admin reserves in another policy",
			lb: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP = "10.98.9.9" },
			policy: func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.ReservedAddresses = []string{"10.98.9.0/24"}
			}, wantKind: "in a range the host admin reserved"},
		{name: "a shared pool that holds a host address, with no IP: LB-IPAM could hand it out",
			lb: func(lb *guestnetv1.LoadBalancerSpec) {
				lb.IP, lb.PoolRef = "", &guestnetv1.PoolReference{Name: "shared"}
			},
			policy: func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} }, wantKind: "a host Node's address"},
		{name: "a shared pool that holds a host address, with an IP beside it",
			lb: func(lb *guestnetv1.LoadBalancerSpec) {
				lb.IP, lb.PoolRef = "10.98.3.9", &guestnetv1.PoolReference{Name: "shared"}
			},
			policy: func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{"shared"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			g2 := gi(func(g *guestnetv1.GuestIngress) { tt.lb(&g.Spec.LoadBalancer) })
			admitting := pol("tenants")
			other := pol("zz-other", func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.NamespaceSelector.MatchLabels = map[string]string{"tenant": "b"}
			})
			if tt.policy != nil {
				tt.policy(&admitting)
				other.Spec.ReservedAddresses = admitting.Spec.ReservedAddresses
				admitting.Spec.ReservedAddresses = nil
			}
			var ps map[string]*unstructured.Unstructured
			if g2.Spec.LoadBalancer.PoolRef != nil {
				ps = pools(shared)
			}
			d := Admit(Input{GuestIngress: g2, Namespace: namespace("tenant-a", map[string]string{"tenant": "a"}),
				Policies: []guestnetv1.GuestIngressPolicy{admitting, other}, Pools: PoolMap(ps), Host: hostSet()})
			if tt.wantKind == "" {
				g.Expect(d.Admitted).To(BeTrue(), d.Message)
				return
			}
			g.Expect(d.Admitted).To(BeFalse())
			g.Expect(d.Reason).To(Equal(guestnetv1.HostAddressReason))
			g.Expect(d.Message).To(ContainSubstring(tt.wantKind))
			g.Expect(d.Message).To(ContainSubstring("guestnet creates nothing on the host"))
			// Which kind, never whose: the host's addresses are named to the admin only.
			for _, a := range []string{"10.98.0.1", "10.98.3.7", "10.98.64.0", "10.98.128.0", "zz-other"} {
				if a != g2.Spec.LoadBalancer.IP {
					g.Expect(d.Message).NotTo(ContainSubstring(a))
				}
			}
			g.Expect(d.Detail).To(ContainSubstring("Host addresses asked for"))
		})
	}
}

func TestAdmitWithoutHostAddressesIsUnchanged(t *testing.T) {
	g := NewWithT(t)
	d := Admit(Input{GuestIngress: gi(), Namespace: namespace("tenant-a", map[string]string{"tenant": "a"}),
		Policies: []guestnetv1.GuestIngressPolicy{pol("tenants")}})
	g.Expect(d.Admitted).To(BeTrue(), d.Message)
}

func TestHeldBeyondAdmittedTakesHostAddressesOff(t *testing.T) {
	g := NewWithT(t)
	p := heldPolicy()
	own := heldGuestIngress()
	held := build(g, own, p)
	// The tenant (admin of its namespace) asks LB-IPAM, on guestnet's host Service, for a
	// Node's address beside its own, and sets spec.loadBalancerIP to the apiserver's.
	held.HostService.Annotations["lbipam.cilium.io/ips"] = "10.98.0.10,10.98.3.7"
	held.HostService.Spec.LoadBalancerIP = "10.98.0.1"
	in := Input{GuestIngress: own, Namespace: namespace("tenant-a", map[string]string{"tenant": "a"}),
		Policies: []guestnetv1.GuestIngressPolicy{p}, Host: hostSet()}
	d := Admit(in)
	g.Expect(d.Admitted).To(BeTrue(), d.Message)
	ex := HeldBeyondAdmitted(in, d, held)
	g.Expect(ex.HostService.Delete).To(BeFalse())
	g.Expect(ex.HostService.Outside).To(ConsistOf(
		"IP request 10.98.3.7 (annotation lbipam.cilium.io/ips; the host cluster uses it for itself: a host Node's address)",
		"spec.loadBalancerIP 10.98.0.1 (the host cluster uses it for itself: an address of the host apiserver)"))
	g.Expect(ex.HostService.Narrowed.Annotations["lbipam.cilium.io/ips"]).To(Equal("10.98.0.10"))
	g.Expect(ex.HostService.Narrowed.Spec.LoadBalancerIP).To(BeEmpty())
	g.Expect(ex.Pool.Within()).To(BeTrue())

	// A load-balancer IP that became a host address (a Node joined with it) is withdrawn
	// whole: the GuestIngress asking for it is no longer admitted.
	in.Host = in.Host.With(hostaddrs.NodeAddress, netip.MustParsePrefix("10.98.0.10/32"))
	d = Admit(in)
	g.Expect(d.Reason).To(Equal(guestnetv1.HostAddressReason))
	ex = HeldBeyondAdmitted(in, d, held)
	g.Expect(ex.HostService.Delete && ex.Pool.Delete && ex.L2Policy.Delete).To(BeTrue())

	// A pool block beside a host address that an admitted GuestIngress's own pool holds
	// (written by hand) is dropped from the pool.
	in.Host = hostSet()
	extra := held.Pool.DeepCopy()
	blocks, _, _ := unstructured.NestedSlice(extra.Object, "spec", "blocks")
	_ = unstructured.SetNestedSlice(extra.Object, append(blocks, map[string]any{"cidr": "10.98.3.0/24"}), "spec", "blocks")
	held.Pool = extra
	ex = HeldBeyondAdmitted(in, Admit(in), held)
	g.Expect(ex.Pool.Outside).To(ConsistOf(ContainSubstring("block 10.98.3.0/24 of CiliumLoadBalancerIPPool tenant-a.guest-1-web (the host cluster uses it for itself: a host Node's address)")))
}

func TestHostAddressesCovered(t *testing.T) {
	g := NewWithT(t)
	p := pol("tenants")
	in := Input{Policies: []guestnetv1.GuestIngressPolicy{p}, Host: hostSet()}
	g.Expect(HostAddressesCovered(&p, in)).To(Equal("10.98.0.1 (APIServer), 10.98.3.7 (NodeAddress), 10.98.64.0/24 (PodCIDR), 10.98.128.0/20 (ServiceCIDR)"))
	p.Spec.Addresses = []string{"10.98.4.0/24"}
	g.Expect(HostAddressesCovered(&p, in)).To(BeEmpty())
}

// A GuestIngress refused for a host address takes no room under the namespace's cap.
func TestQuotaIgnoresGuestIngressesRefusedForHostAddresses(t *testing.T) {
	g := NewWithT(t)
	older := *gi(func(g *guestnetv1.GuestIngress) {
		g.Name, g.Spec.LoadBalancer.IP = "older", "10.98.3.7"
		g.CreationTimestamp = metav1.NewTime(created.Add(-time.Hour))
	})
	p := pol("tenants", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.MaxGuestIngressesPerNamespace = ptr.To[int32](1) })
	in := Input{GuestIngress: gi(), Namespace: namespace("tenant-a", map[string]string{"tenant": "a"}),
		Policies: []guestnetv1.GuestIngressPolicy{p}, Siblings: []guestnetv1.GuestIngress{older}, Host: hostSet()}
	d := Admit(in)
	g.Expect(d.Admitted).To(BeTrue(), d.Message)
	in.Host = hostaddrs.Set{}
	g.Expect(Admit(in).Reason).To(Equal(guestnetv1.QuotaExceededReason), "without host addresses the older one takes the room")
}
