package guestingress

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// The index finds every claimant entangled with a GuestIngress, also through what another
// one holds but no longer asks for, and through a chain; nothing farther.
func TestEntangledClaimantsAreFoundThroughTheAddressIndex(t *testing.T) {
	g := NewWithT(t)
	at := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	newGI := func(name string, lb guestnetv1.LoadBalancerSpec) *guestnetv1.GuestIngress {
		at = at.Add(time.Second)
		return &guestnetv1.GuestIngress{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(at)},
			Spec: guestnetv1.GuestIngressSpec{ClusterName: name, GuestService: guestnetv1.ObjectReference{Namespace: "ingress", Name: "envoy"},
				Ports: []guestnetv1.IngressPort{{Name: "http", Port: 80}}, LoadBalancer: lb},
		}
	}
	a := newGI("a", guestnetv1.LoadBalancerSpec{IP: "10.2.6.220"})
	// b's pool holds 10.2.6.216/29 (around a's IP) from its former spec; it asks for
	// 10.2.7.0/30 now.
	b := newGI("b", guestnetv1.LoadBalancerSpec{CIDRs: []string{"10.2.6.216/29"}})
	bPool := ingress.Pool(b)
	b.Spec.LoadBalancer.CIDRs = []string{"10.2.7.0/30"}
	// c asks for an IP in what b asks for now; d's host Service holds an IP in a /24 of its
	// own, which it asks for; e is far away.
	c := newGI("c", guestnetv1.LoadBalancerSpec{IP: "10.2.7.1"})
	d := newGI("d", guestnetv1.LoadBalancerSpec{IP: "10.2.7.2", CIDRs: []string{"10.2.7.2/32"}})
	e := newGI("e", guestnetv1.LoadBalancerSpec{IP: "10.9.0.1"})
	eService := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "tenants", Name: hostnames.HostService(e), Labels: map[string]string{"app.kubernetes.io/managed-by": "guestnet"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: guestnetv1.GroupVersion.String(), Kind: "GuestIngress", Name: "e", UID: e.UID, Controller: ptr.To(true)}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "10.9.0.1"}}}}}
	r := newFakeReconciler(t, a, b, bPool, c, d, e, eService)

	ctx := context.Background()
	w, err := r.readHost(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	names := func(cs []ingress.Claimant) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.GuestIngress.Name)
		}
		return out
	}
	self := func(gi *guestnetv1.GuestIngress) ingress.Claimant {
		held, err := r.held(ctx, w, gi)
		g.Expect(err).NotTo(HaveOccurred())
		return ingress.Claimant{GuestIngress: gi, Held: held, Eligible: true}
	}

	got, err := r.entangledClaimants(ctx, w, self(a))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(names(got)).To(ConsistOf("b", "c", "d"), "b holds around a's IP; c and d ask for what b asks for")
	g.Expect(got[0].Held.Prefixes).NotTo(BeEmpty(), "what b's pool holds is read")

	got, err = r.entangledClaimants(ctx, w, self(e))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(BeEmpty())
	g.Expect(self(e).Held.IP.String()).To(Equal("10.9.0.1"), "what e's host Service holds is read")
}
