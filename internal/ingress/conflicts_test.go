package ingress

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// claimant is a GuestIngress created at t0 + age seconds with the given load balancer.
func claimant(ns, name string, age int, lb guestnetv1.LoadBalancerSpec, mutate ...func(*guestnetv1.GuestIngress)) guestnetv1.GuestIngress {
	gi := newGI(func(gi *guestnetv1.GuestIngress) {
		gi.Namespace, gi.Name = ns, name
		gi.CreationTimestamp = metav1.NewTime(t0.Add(time.Duration(age) * time.Second))
		gi.Spec.LoadBalancer = lb
	})
	for _, m := range mutate {
		m(gi)
	}
	return *gi
}

func holding(ip string) func(*guestnetv1.GuestIngress) {
	return func(gi *guestnetv1.GuestIngress) {
		gi.Status.LoadBalancerIP = ip
		gi.Status.Conditions = []metav1.Condition{{Type: guestnetv1.LoadBalancerReadyCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.ReadyReason}}
	}
}

func ip(s string) guestnetv1.LoadBalancerSpec { return guestnetv1.LoadBalancerSpec{IP: s} }

func cidrs(c ...string) guestnetv1.LoadBalancerSpec { return guestnetv1.LoadBalancerSpec{CIDRs: c} }

func TestFindConflict(t *testing.T) {
	tests := []struct {
		name       string
		gi         guestnetv1.GuestIngress
		others     []guestnetv1.GuestIngress
		wantReason string
		wantHolder string
		wantText   string
	}{
		{
			name:   "alone",
			gi:     claimant("a", "web", 1, ip("10.2.6.220")),
			others: nil,
		},
		{
			name:       "same IP in another namespace, the other is older",
			gi:         claimant("b", "web", 2, ip("10.2.6.220")),
			others:     []guestnetv1.GuestIngress{claimant("a", "web", 1, ip("10.2.6.220"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
			wantText: "IP 10.2.6.220 is already claimed by GuestIngress a/web (cluster tenant-a, created earlier)",
		},
		{
			name:   "same IP, this one is older: it keeps it",
			gi:     claimant("a", "web", 1, ip("10.2.6.220")),
			others: []guestnetv1.GuestIngress{claimant("b", "web", 2, ip("10.2.6.220"))},
		},
		{
			name:       "same second: namespace/name decides",
			gi:         claimant("b", "web", 1, ip("10.2.6.220")),
			others:     []guestnetv1.GuestIngress{claimant("a", "web", 1, ip("10.2.6.220"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
		},
		{
			// A working GuestIngress is never displaced, whatever the timestamps say.
			name:       "the one that has the IP keeps it",
			gi:         claimant("a", "web", 1, ip("10.2.6.220")),
			others:     []guestnetv1.GuestIngress{claimant("b", "web", 1, ip("10.2.6.220"), holding("10.2.6.220"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "b/web",
			wantText: "it has the IP 10.2.6.220",
		},
		{
			name:       "IP inside an older GuestIngress's pool",
			gi:         claimant("b", "web", 2, ip("10.2.6.220")),
			others:     []guestnetv1.GuestIngress{claimant("a", "web", 1, cidrs("10.2.6.216/29"))},
			wantReason: guestnetv1.IPConflictReason, wantHolder: "a/web",
		},
		{
			name:       "overlapping pools",
			gi:         claimant("b", "web", 2, cidrs("10.2.6.0/24")),
			others:     []guestnetv1.GuestIngress{claimant("a", "web", 1, cidrs("10.2.6.216/29"))},
			wantReason: guestnetv1.PoolConflictReason, wantHolder: "a/web",
			wantText: "The pool ranges 10.2.6.0/24 overlap 10.2.6.216/29 of GuestIngress a/web",
		},
		{
			name:   "disjoint pools",
			gi:     claimant("b", "web", 2, cidrs("10.2.7.0/24")),
			others: []guestnetv1.GuestIngress{claimant("a", "web", 1, cidrs("10.2.6.0/24"))},
		},
		{
			name: "a shared pool and different IPs",
			gi:   claimant("b", "web", 2, guestnetv1.LoadBalancerSpec{IP: "10.2.6.221", PoolRef: &guestnetv1.PoolReference{Name: "shared"}}),
			others: []guestnetv1.GuestIngress{
				claimant("a", "web", 1, guestnetv1.LoadBalancerSpec{IP: "10.2.6.220", PoolRef: &guestnetv1.PoolReference{Name: "shared"}}),
			},
		},
		{
			name:   "a shared pool, no IP: nothing claimed",
			gi:     claimant("b", "web", 2, guestnetv1.LoadBalancerSpec{PoolRef: &guestnetv1.PoolReference{Name: "shared"}}),
			others: []guestnetv1.GuestIngress{claimant("a", "web", 1, guestnetv1.LoadBalancerSpec{PoolRef: &guestnetv1.PoolReference{Name: "shared"}})},
		},
		{
			// b is refused because of a, so b holds nothing, and c (which overlaps only b) may go.
			name: "only claims that are kept count",
			gi:   claimant("c", "web", 3, cidrs("10.2.6.128/25")),
			others: []guestnetv1.GuestIngress{
				claimant("a", "web", 1, cidrs("10.2.6.0/25")),
				claimant("b", "web", 2, cidrs("10.2.6.0/24")),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			all := append([]guestnetv1.GuestIngress{tt.gi}, tt.others...)
			c := FindConflict(&tt.gi, all)
			if tt.wantReason == "" {
				g.Expect(c).To(BeNil())
				return
			}
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(tt.wantReason))
			g.Expect(c.Holder).To(Equal(tt.wantHolder))
			g.Expect(c.Message).To(ContainSubstring(tt.wantText))
			// The holder, decided from its side, keeps its claim: the decision is mutual.
			for i := range all {
				if all[i].Namespace+"/"+all[i].Name == tt.wantHolder {
					g.Expect(FindConflict(&all[i], all)).To(BeNil())
				}
			}
		})
	}
}

func TestOverlap(t *testing.T) {
	g := NewWithT(t)
	a := claimant("a", "web", 1, ip("10.2.6.220"))
	b := claimant("b", "web", 2, cidrs("10.2.6.216/29"))
	c := claimant("c", "web", 3, cidrs("10.2.7.0/24"))
	g.Expect(Overlap(&a, &b)).To(BeTrue())
	g.Expect(Overlap(&b, &a)).To(BeTrue())
	g.Expect(Overlap(&a, &c)).To(BeFalse())
}
