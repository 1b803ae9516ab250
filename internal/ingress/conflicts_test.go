package ingress

import (
	"net/netip"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// claimant is an eligible GuestIngress created at t0 + age seconds with the given load
// balancer, holding nothing, adjusted by mutate.
func claimant(ns, name string, age int, lb guestnetv1.LoadBalancerSpec, mutate ...func(*Claimant)) Claimant {
	gi := newGI(func(gi *guestnetv1.GuestIngress) {
		gi.Namespace, gi.Name = ns, name
		gi.CreationTimestamp = metav1.NewTime(t0.Add(time.Duration(age) * time.Second))
		gi.Spec.LoadBalancer = lb
	})
	c := Claimant{GuestIngress: gi, Eligible: true}
	for _, m := range mutate {
		m(&c)
	}
	return c
}

// holding makes the claimant's objects hold what it asks for (its pool, or its IP).
func holding(c *Claimant) { c.Held = c.Wants() }

// holdingSpace makes the claimant's objects hold the given ranges.
func holdingSpace(cidrs ...string) func(*Claimant) {
	return func(c *Claimant) {
		for _, s := range cidrs {
			c.Held.Prefixes = append(c.Held.Prefixes, netip.MustParsePrefix(s))
		}
	}
}

func ineligible(c *Claimant) { c.Eligible = false }

func ip(s string) guestnetv1.LoadBalancerSpec { return guestnetv1.LoadBalancerSpec{IP: s} }

func cidrs(c ...string) guestnetv1.LoadBalancerSpec { return guestnetv1.LoadBalancerSpec{CIDRs: c} }

func poolRef(ip string) guestnetv1.LoadBalancerSpec {
	return guestnetv1.LoadBalancerSpec{IP: ip, PoolRef: &guestnetv1.PoolReference{Name: "shared"}}
}

func TestContest(t *testing.T) {
	tests := []struct {
		name        string
		self        Claimant
		others      []Claimant
		wantReason  string
		wantHolder  string
		wantText    string
		wantDetail  string
		wantRelease bool
	}{
		{name: "alone", self: claimant("a", "web", 1, ip("10.2.6.220"))},
		{
			name:       "same IP in another namespace, the other is older",
			self:       claimant("b", "web", 2, ip("10.2.6.220")),
			others:     []Claimant{claimant("a", "web", 1, ip("10.2.6.220"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
			// Another namespace's: not named to the tenant (Detail names it, for the log).
			wantText: "IP 10.2.6.220 is already claimed by another namespace's GuestIngress (created earlier), which keeps it; " +
				"guestnet created no host objects for this GuestIngress",
			wantDetail: "GuestIngress a/web (cluster tenant-a, created earlier) asks for 10.2.6.220/32 and keeps it (pool a.tenant-a-web)",
		},
		{
			name:       "same IP in this namespace, the other is older: named",
			self:       claimant("a", "web-2", 2, ip("10.2.6.220")),
			others:     []Claimant{claimant("a", "web", 1, ip("10.2.6.220"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
			wantText: "IP 10.2.6.220 is already claimed by GuestIngress web of this namespace (cluster tenant-a, created earlier), which asks for 10.2.6.220/32 " +
				"and keeps it; guestnet created no host objects for this GuestIngress. Choose another spec.loadBalancer.ip, or delete GuestIngress web",
		},
		{name: "same IP, this one is older: it keeps it", self: claimant("a", "web", 1, ip("10.2.6.220")), others: []Claimant{claimant("b", "web", 2, ip("10.2.6.220"))}},
		{
			name:       "same second: namespace/name decides",
			self:       claimant("b", "web", 1, ip("10.2.6.220")),
			others:     []Claimant{claimant("a", "web", 1, ip("10.2.6.220"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
		},
		{
			// A working GuestIngress is never displaced, whatever the timestamps say.
			name:       "the one that holds the IP on the host keeps it",
			self:       claimant("a", "web", 1, ip("10.2.6.220")),
			others:     []Claimant{claimant("b", "web", 5, ip("10.2.6.220"), holding)},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "b/web", wantText: "it holds them on the host",
		},
		{
			name:   "a holder keeps its IP whatever its status says: an older claim is refused",
			self:   claimant("b", "web", 5, ip("10.2.6.220"), holding),
			others: []Claimant{claimant("a", "web", 1, ip("10.2.6.220"))},
		},
		{
			name:       "IP inside an older GuestIngress's pool",
			self:       claimant("b", "web", 2, ip("10.2.6.220")),
			others:     []Claimant{claimant("a", "web", 1, cidrs("10.2.6.216/29"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
		},
		{
			name:       "a pool that holds an older one's IP",
			self:       claimant("b", "web", 2, cidrs("10.2.6.216/29")),
			others:     []Claimant{claimant("a", "web", 1, ip("10.2.6.220"))},
			wantReason: guestnetv1.PoolConflictReason, wantHolder: "a/web",
		},
		{
			name:       "overlapping pools",
			self:       claimant("b", "web", 2, cidrs("10.2.6.0/24")),
			others:     []Claimant{claimant("a", "web", 1, cidrs("10.2.6.216/29"))},
			wantReason: guestnetv1.PoolConflictReason, wantHolder: "a/web",
			wantText: "The addresses 10.2.6.216/29 of the pool ranges 10.2.6.0/24 are already claimed by another namespace's GuestIngress (created earlier)",
		},
		{
			name:       "overlapping pools in this namespace",
			self:       claimant("a", "web-2", 2, cidrs("10.2.6.0/24")),
			others:     []Claimant{claimant("a", "web", 1, cidrs("10.2.6.216/29"))},
			wantReason: guestnetv1.PoolConflictReason, wantHolder: "a/web",
			wantText: "The pool ranges 10.2.6.0/24 overlap 10.2.6.216/29 of GuestIngress web of this namespace (cluster tenant-a, created earlier) (pool a.tenant-a-web)",
		},
		{name: "disjoint pools", self: claimant("b", "web", 2, cidrs("10.2.7.0/24")), others: []Claimant{claimant("a", "web", 1, cidrs("10.2.6.0/24"))}},
		{name: "a shared pool and different IPs", self: claimant("b", "web", 2, poolRef("10.2.6.221")), others: []Claimant{claimant("a", "web", 1, poolRef("10.2.6.220"))}},
		{
			name:       "poolRef IP requests count like any other claim",
			self:       claimant("b", "web", 2, ip("10.2.6.220")),
			others:     []Claimant{claimant("a", "web", 1, poolRef("10.2.6.220"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
		},
		{
			name:   "a shared pool, no IP: nothing claimed",
			self:   claimant("b", "web", 2, guestnetv1.LoadBalancerSpec{PoolRef: &guestnetv1.PoolReference{Name: "shared"}}),
			others: []Claimant{claimant("a", "web", 1, guestnetv1.LoadBalancerSpec{PoolRef: &guestnetv1.PoolReference{Name: "shared"}})},
		},
		{
			// b is refused because of a, so b holds nothing, and c (which overlaps only b) may go.
			name:   "only claims that are kept count",
			self:   claimant("c", "web", 3, cidrs("10.2.6.128/25")),
			others: []Claimant{claimant("a", "web", 1, cidrs("10.2.6.0/25")), claimant("b", "web", 2, cidrs("10.2.6.0/24"))},
		},
		{
			name:   "an older claim that cannot hold host objects (no Cluster, paused, not admitted) claims nothing",
			self:   claimant("b", "web", 2, ip("10.2.6.220")),
			others: []Claimant{claimant("a", "web", 1, ip("10.2.6.220"), ineligible)},
		},
		{
			// Its pool exists until its own reconcile deletes it; a pool next to it would be
			// disabled by Cilium.
			name:       "what an ineligible one still holds counts until it is gone",
			self:       claimant("b", "web", 2, ip("10.2.6.220")),
			others:     []Claimant{claimant("a", "web", 1, ip("10.2.6.220"), holding, ineligible)},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
		},
		{
			name:       "two holders that overlap (two creations raced): the younger releases",
			self:       claimant("b", "web", 2, ip("10.2.6.220"), holding),
			others:     []Claimant{claimant("a", "web", 1, ip("10.2.6.220"), holding)},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
			wantRelease: true, wantText: "guestnet deletes this GuestIngress's host objects, which overlap it",
		},
		{name: "two holders that overlap: the older keeps", self: claimant("a", "web", 1, ip("10.2.6.220"), holding), others: []Claimant{claimant("b", "web", 2, ip("10.2.6.220"), holding)}},
		{
			name:   "a race against one that may not hold anything any more: it releases, not this one",
			self:   claimant("b", "web", 2, ip("10.2.6.220"), holding),
			others: []Claimant{claimant("a", "web", 1, ip("10.2.6.220"), holding, ineligible)},
		},
		{
			// An older holder whose spec grows into the space a younger one holds does not
			// take it: it is refused and keeps what it had.
			name:       "a holder's spec reaching into another holder's space is refused, and keeps what it has",
			self:       claimant("a", "web", 1, cidrs("10.2.6.0/28"), holdingSpace("10.2.6.0/29")),
			others:     []Claimant{claimant("b", "web", 2, cidrs("10.2.6.8/29"), holding)},
			wantReason: guestnetv1.PoolConflictReason, wantHolder: "b/web",
			wantText: "guestnet leaves this GuestIngress's host objects as they are and applies none of its changes",
		},
		{
			name:   "the holder whose space another one's spec reaches into keeps it",
			self:   claimant("b", "web", 2, cidrs("10.2.6.8/29"), holding),
			others: []Claimant{claimant("a", "web", 1, cidrs("10.2.6.0/28"), holdingSpace("10.2.6.0/29"))},
		},
		{
			name:       "two holders growing into each other's space: both are refused, the other way round too",
			self:       claimant("a", "web", 1, cidrs("10.2.6.0/29"), holdingSpace("10.2.6.0/30")),
			others:     []Claimant{claimant("b", "web", 2, cidrs("10.2.6.0/29"), holdingSpace("10.2.6.4/30"))},
			wantReason: guestnetv1.PoolConflictReason, wantHolder: "b/web",
		},
		{
			// A moved away from X and still holds it until its pool is applied anew; an older
			// claim for X waits, A goes ahead with Y.
			name:   "a holder that moved to other space goes ahead",
			self:   claimant("b", "web", 5, cidrs("10.2.7.0/29"), holdingSpace("10.2.6.0/29")),
			others: []Claimant{claimant("a", "web", 1, cidrs("10.2.6.0/29"))},
		},
		{
			name:       "the older claim for space a holder moved away from waits until it is gone",
			self:       claimant("a", "web", 1, cidrs("10.2.6.0/29")),
			others:     []Claimant{claimant("b", "web", 5, cidrs("10.2.7.0/29"), holdingSpace("10.2.6.0/29"))},
			wantReason: guestnetv1.PoolConflictReason, wantHolder: "b/web",
		},
		{name: "an ineligible self is not decided here", self: claimant("b", "web", 2, ip("10.2.6.220"), ineligible), others: []Claimant{claimant("a", "web", 1, ip("10.2.6.220"))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			c := Contest(tt.self, tt.others)
			if tt.wantReason == "" {
				g.Expect(c).To(BeNil())
			} else {
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Reason).To(Equal(tt.wantReason))
				g.Expect(c.Holder).To(Equal(tt.wantHolder))
				g.Expect(c.Message).To(ContainSubstring(tt.wantText))
				g.Expect(c.Detail).To(ContainSubstring(tt.wantDetail))
				g.Expect(c.Release).To(Equal(tt.wantRelease))
			}
			expectNoTwoKeptCollide(g, append([]Claimant{tt.self}, tt.others...))
		})
	}
}

// Decided from each claimant's side, the claims kept never share an address, and none asks for
// space another one's objects occupy, but for the winner of a race.
func expectNoTwoKeptCollide(g Gomega, all []Claimant) {
	var kept []Claimant
	for i, c := range all {
		others := append(append([]Claimant{}, all[:i]...), all[i+1:]...)
		if c.Eligible && Contest(c, others) == nil && !c.Wants().Empty() {
			kept = append(kept, c)
		}
	}
	for i, a := range kept {
		for _, b := range kept[i+1:] {
			g.Expect(a.Wants().Collides(b.Wants())).To(BeFalse(), "%s and %s are both kept", a.key(), b.key())
		}
		for _, h := range all {
			if h.key() != a.key() && a.Wants().Collides(h.Held) && !a.Held.Collides(h.Held) {
				g.Expect(false).To(BeTrue(), "%s is kept in space %s holds", a.key(), h.key())
			}
		}
	}
}

func TestEntangled(t *testing.T) {
	g := NewWithT(t)
	self := claimant("a", "web", 1, cidrs("10.2.6.0/29"))
	direct := claimant("b", "web", 2, ip("10.2.6.1"))
	viaHeld := claimant("c", "web", 3, cidrs("10.9.0.0/24"), holdingSpace("10.2.6.4/30"))
	chained := claimant("d", "web", 4, ip("10.9.0.7"))
	apart := claimant("e", "web", 5, ip("10.3.0.1"))
	got := Entangled(self, []Claimant{apart, chained, direct, viaHeld, self})
	var keys []string
	for _, c := range got {
		keys = append(keys, c.key())
	}
	g.Expect(keys).To(ConsistOf("b/web", "c/web", "d/web"))
}

func poolWithBlocks(name string, blocks ...map[string]any) *unstructured.Unstructured {
	u := NewPool()
	u.SetName(name)
	items := make([]any, len(blocks))
	for i, b := range blocks {
		items[i] = b
	}
	u.Object["spec"] = map[string]any{"blocks": items}
	return u
}

func TestPoolBlocks(t *testing.T) {
	g := NewWithT(t)
	p := poolWithBlocks("p",
		map[string]any{"cidr": "10.0.0.1/24"},
		map[string]any{"start": "10.1.0.3", "stop": "10.1.0.9"},
		map[string]any{"start": "fd00::", "stop": "fd00::ff"},
		map[string]any{"start": "10.2.0.9", "stop": "10.2.0.1"}, // reversed: skipped
		map[string]any{"cidr": "garbage"},
	)
	var got []string
	for _, pr := range PoolBlocks(p) {
		got = append(got, pr.String())
	}
	g.Expect(got).To(Equal([]string{"10.0.0.0/24", "10.1.0.3/32", "10.1.0.4/30", "10.1.0.8/31", "fd00::/120"}))
	g.Expect(rangePrefixes(netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"))).To(Equal([]netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}))
}

func TestForeignPoolConflict(t *testing.T) {
	g := NewWithT(t)
	admin := poolWithBlocks("admin", map[string]any{"start": "10.2.6.64", "stop": "10.2.6.95"})
	other := poolWithBlocks("other", map[string]any{"cidr": "10.9.0.0/16"})
	gi := newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer = cidrs("10.2.6.88/29") })

	c := ForeignPoolConflict(gi, Claim{}, []*unstructured.Unstructured{other, admin})
	g.Expect(c).NotTo(BeNil())
	g.Expect(c.Reason).To(Equal(guestnetv1.PoolConflictReason))
	g.Expect(c.Holder).To(Equal("CiliumLoadBalancerIPPool admin"))
	g.Expect(c.Message).To(ContainSubstring("The pool ranges 10.2.6.88/29 are in a pool of the platform, which guestnet does not manage"))
	g.Expect(c.Message).NotTo(ContainSubstring("admin"), "the platform's pools are not named to a tenant")
	g.Expect(c.Detail).To(Equal("CiliumLoadBalancerIPPool admin (10.2.6.64/27) overlaps the ranges"))
	// Cilium's LB-IPAM (run for real in the lab, TestLab_RealLBIPAM) disables one pool of an
	// overlapping pair created in the same second, whichever it meets first, never both.
	g.Expect(c.Message).To(ContainSubstring("Cilium disables the newer of two overlapping pools (either one, when they were created in the same second)"))
	g.Expect(c.Release).To(BeFalse())

	// Ranges only part of which the admin's pool holds: the message shows that part alone.
	wide := newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer = cidrs("10.2.6.0/24") })
	g.Expect(ForeignPoolConflict(wide, Claim{}, []*unstructured.Unstructured{admin}).Message).To(
		ContainSubstring("The addresses 10.2.6.64/27 of the pool ranges 10.2.6.0/24 are in a pool of the platform"))
	single := newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer = ip("10.2.6.70") })
	g.Expect(ForeignPoolConflict(single, Claim{}, []*unstructured.Unstructured{admin}).Message).To(
		ContainSubstring("The pool ranges 10.2.6.70 are in a pool of the platform"))

	// Its own pool already overlaps the admin's: it goes, so that Cilium enables the admin's.
	c = ForeignPoolConflict(gi, Claim{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.2.6.88/29")}}, []*unstructured.Unstructured{admin})
	g.Expect(c.Release).To(BeTrue())

	g.Expect(ForeignPoolConflict(newGI(), Claim{}, []*unstructured.Unstructured{admin, other})).To(BeNil())
	withPoolRef := newGI(func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer = poolRef("10.2.6.70") })
	g.Expect(ForeignPoolConflict(withPoolRef, Claim{}, []*unstructured.Unstructured{admin})).To(BeNil(), "no pool of its own")
}

func TestServiceIPs(t *testing.T) {
	g := NewWithT(t)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"lbipam.cilium.io/ips": "10.0.0.1, 10.0.0.2", "io.cilium/lb-ipam-ips": "fd00::1"}},
		Spec:       corev1.ServiceSpec{LoadBalancerIP: "10.0.0.3"},
		Status:     corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{Hostname: "x"}, {IP: "10.0.0.4"}}}},
	}
	g.Expect(ServiceIPs(svc)).To(Equal([]netip.Addr{
		netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::1"),
		netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.4"),
	}))
}

func TestOverlap(t *testing.T) {
	g := NewWithT(t)
	a := claimant("a", "web", 1, ip("10.2.6.220")).GuestIngress
	b := claimant("b", "web", 2, cidrs("10.2.6.216/29")).GuestIngress
	c := claimant("c", "web", 3, cidrs("10.2.7.0/24")).GuestIngress
	g.Expect(Overlap(a, b)).To(BeTrue())
	g.Expect(Overlap(b, a)).To(BeTrue())
	g.Expect(Overlap(a, c)).To(BeFalse())
}
