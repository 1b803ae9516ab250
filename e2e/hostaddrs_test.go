package e2e

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// The host's own addresses are never a tenant's, whatever a policy admits (issue 22,
// docs/decisions/0012-host-addresses-are-never-a-tenants.md). The policy admits ranges that
// hold each kind of host address the lab has: the host apiserver (the endpoints of
// default/kubernetes, lab.HostAPIServerAddress), its Service network (the ServiceCIDR the
// apiserver makes from lab.HostServiceCIDR), a host Node's address and pod CIDR (a Node
// made here), and a range the admin reserves. The tenant asks for each, as the tenant:
// nothing is created, and the condition says which kind of host address, never whose. A
// Node that joins later with a GuestIngress's address takes it: everything the GuestIngress
// held is withdrawn, and given back when the Node goes.
func TestSecurity_HostAddressesAreNeverATenants(t *testing.T) {
	e := newSecurityEnv(t, "10.98.114")
	net := e.lbNet
	policy := e.createPolicy("hostaddrs", func(p *guestnetv1.GuestIngressPolicy) {
		p.Spec.Addresses = []string{net + ".0/24", "10.244.0.0/30", "10.97.0.0/24"}
		p.Spec.ReservedAddresses = []string{net + ".240/28"}
	})
	node := e.createHostNode(t, "hostaddr-"+e.ns, net+".7", net+".64/27")

	refused := []struct{ name, ip, cidr, kind string }{
		{name: "apiserver", ip: lab.HostAPIServerAddress, kind: "an address of the host apiserver"},
		{name: "service-network", ip: "10.97.0.1", kind: "in the host's Service network"},
		{name: "node", ip: net + ".7", kind: "a host Node's address"},
		{name: "pod-network", ip: net + ".70", kind: "in the host's pod network"},
		{name: "reserved", ip: net + ".241", kind: "in a range the host admin reserved"},
		// A range that holds one host address is refused as a whole.
		{name: "cidr", cidr: net + ".0/29", kind: "a host Node's address"},
	}
	for _, r := range refused {
		t.Run(r.name, func(t *testing.T) {
			g := NewWithT(t)
			gi := e.newGuestIngress(r.name, r.ip)
			if r.cidr != "" {
				gi.Spec.LoadBalancer.IP, gi.Spec.LoadBalancer.CIDRs = "", []string{r.cidr}
			}
			g.Expect(e.tenant.Create(e.ctx, gi)).To(Succeed())
			t.Cleanup(func() { _ = e.tenant.Delete(context.Background(), gi) })
			var c metav1.Condition
			g.Eventually(func() string { c = e.admitted(gi); return c.Reason }).WithTimeout(giTimeout).
				Should(Equal(guestnetv1.HostAddressReason), "Admitted of %s", gi.Name)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(ContainSubstring(r.kind))
			g.Expect(c.Message).To(ContainSubstring("guestnet creates nothing on the host"))
			g.Expect(c.Message).NotTo(ContainSubstring(node.Name), "the tenant learns the kind of host address, never whose")
			e.expectNothingOnTheHost(t, gi)
		})
	}

	t.Run("a-node-joins-with-the-address", func(t *testing.T) {
		g := NewWithT(t)
		gi := e.newGuestIngress("joined", net+".20")
		g.Expect(e.tenant.Create(e.ctx, gi)).To(Succeed())
		e.eventuallyAdmitted(t, gi, metav1.ConditionTrue)
		e.eventuallyHostService(t, gi)

		joined := e.createHostNode(t, "joined-"+e.ns, net+".20", "")
		c := e.eventuallyAdmitted(t, gi, metav1.ConditionFalse)
		g.Expect(c.Reason).To(Equal(guestnetv1.HostAddressReason))
		g.Expect(c.Message).To(ContainSubstring("a host Node's address"))
		e.expectNothingOnTheHost(t, gi)

		g.Expect(e.host.Delete(e.ctx, joined)).To(Succeed())
		e.eventuallyAdmitted(t, gi, metav1.ConditionTrue)
		e.eventuallyHostService(t, gi)
	})

	// The policy's status tells the admin what it admits that guestnet never hands out.
	g := NewWithT(t)
	g.Eventually(func(g Gomega) {
		got := &guestnetv1.GuestIngressPolicy{}
		g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(policy), got)).To(Succeed())
		c := conditions.Get(got, guestnetv1.HostAddressesOutsideCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(guestnetv1.CoversHostAddressesReason))
		g.Expect(c.Message).To(And(ContainSubstring(lab.HostAPIServerAddress+" (APIServer)"), ContainSubstring(net+".7 (NodeAddress)"),
			ContainSubstring("10.97.0.0/16 (ServiceCIDR)"), ContainSubstring(net+".240/28 (Reserved)")))
	}).WithTimeout(giTimeout).Should(Succeed())
}

// createHostNode creates a host Node with InternalIP ip and, when set, pod CIDR podCIDR (no
// kubelet: the addresses are what guestnet reads); it is deleted when the test ends.
func (e *securityEnv) createHostNode(t *testing.T, name, ip, podCIDR string) *corev1.Node {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if podCIDR != "" {
		node.Spec.PodCIDR, node.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	NewWithT(t).Expect(e.host.Create(e.ctx, node)).To(Succeed())
	t.Cleanup(func() { _ = e.host.Delete(context.Background(), node) })
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	NewWithT(t).Expect(e.host.Status().Update(e.ctx, node)).To(Succeed(), fmt.Sprintf("status of Node %s", name))
	return node
}
