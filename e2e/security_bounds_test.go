package e2e

// Rows of docs/security.md's attack table that the policy bounds rather than refuses, and
// those that need a second tenant: tried, like the rest of the table, by tenant identities
// holding only `admin` in their namespaces against the shipped manager binary running as a
// ServiceAccount with the generated RBAC, without the optional admission policies.
//
// Run with: make test TEST_PKGS=./e2e/ TEST_ARGS='-run TestSecurity_TheSpecIsBoundedByThePolicy -v'

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

func TestSecurity_TheSpecIsBoundedByThePolicy(t *testing.T) {
	e := newSecurityEnv(t, "10.98.130")
	edge := map[string]string{"node-role.kubernetes.io/edge": ""}
	shared := "shared-" + e.ns
	e.createPolicy("bounds", func(p *guestnetv1.GuestIngressPolicy) {
		p.Spec.L2Announcement.NodeSelector = metav1.LabelSelector{MatchLabels: edge}
		p.Spec.SharedPools = []string{shared}
	})
	e.createPool(shared, map[string]any{"matchLabels": map[string]any{ingress.ServiceNamespaceKey: e.ns}}, "10.98.131.0/28")

	// The tenant's node selector only narrows the admin's: the L2 policy guestnet builds
	// never selects a node the policy's nodeSelector leaves out.
	t.Run("announce-from-any-node", func(t *testing.T) {
		g := NewWithT(t)
		for name, own := range map[string]*metav1.LabelSelector{
			"every-node": {},
			"no-edge":    {MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "node-role.kubernetes.io/edge", Operator: metav1.LabelSelectorOpDoesNotExist}}},
		} {
			gi := e.ownGuestIngress(t, "nodes-"+name, map[string]string{"every-node": "10.98.130.10", "no-edge": "10.98.130.11"}[name])
			gi.Spec.LoadBalancer.L2.NodeSelector = own
			g.Expect(e.tenant.Create(e.ctx, gi)).To(Succeed())
			if c := e.eventuallyAdmittedEither(t, gi); c.Status == metav1.ConditionFalse {
				e.expectNothingOnTheHost(t, gi)
				continue
			}
			l2 := e.getCilium(t, ingress.NewL2Policy(), hostnames.L2Policy(gi))
			spec, _ := l2.Object["spec"].(map[string]any)
			raw, ok := spec["nodeSelector"].(map[string]any)
			g.Expect(ok).To(BeTrue(), "%s: the L2 policy has a nodeSelector: %v", name, spec)
			sel := &metav1.LabelSelector{}
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(raw, sel)).To(Succeed())
			s, err := metav1.LabelSelectorAsSelector(sel)
			g.Expect(err).NotTo(HaveOccurred())
			for _, node := range []labels.Set{{}, {"kubernetes.io/hostname": "mgmt-0"}, {"node-role.kubernetes.io/control-plane": ""}} {
				g.Expect(s.Matches(node)).To(BeFalse(), "%s: the L2 policy announces from a node without the policy's label %v: %s", name, node, s)
			}
		}
	})

	// An IP outside the offered shared pool, though inside the policy's addresses.
	t.Run("poolref-ip-outside", func(t *testing.T) {
		gi := e.ownGuestIngress(t, "poolref-outside", "10.98.130.50")
		gi.Spec.LoadBalancer.PoolRef = &guestnetv1.PoolReference{Name: shared}
		NewWithT(t).Expect(e.tenant.Create(e.ctx, gi)).To(Succeed())
		c := e.eventuallyAdmitted(t, gi, metav1.ConditionFalse)
		NewWithT(t).Expect(c.Message).To(ContainSubstring("10.98.130.50"))
		e.expectNothingOnTheHost(t, gi)
	})

	// IPv4 addresses written as IPv4-mapped IPv6 never get past IPv4 ranges: the API server
	// refuses them, or admission does.
	t.Run("ipv4-mapped", func(t *testing.T) {
		for name, mutate := range map[string]func(*guestnetv1.LoadBalancerSpec){
			"ip":    func(lb *guestnetv1.LoadBalancerSpec) { lb.IP = "::ffff:10.98.130.7" },
			"cidrs": func(lb *guestnetv1.LoadBalancerSpec) { lb.IP, lb.CIDRs = "", []string{"::ffff:10.98.130.0/124"} },
		} {
			gi := e.newGuestIngress("mapped-"+name, "")
			mutate(&gi.Spec.LoadBalancer)
			err := e.tenant.Create(e.ctx, gi)
			if apierrors.IsInvalid(err) {
				t.Logf("%s: refused by the API server: %v", name, err)
				continue
			}
			NewWithT(t).Expect(err).NotTo(HaveOccurred())
			e.eventuallyAdmitted(t, gi, metav1.ConditionFalse)
			e.expectNothingOnTheHost(t, gi)
		}
	})

	// A field guestnet sets on its host Service, changed by the tenant, is put back: the
	// Service selects the Cluster's workers again and takes no traffic policy the policy does
	// not admit.
	t.Run("edit-host-service", func(t *testing.T) {
		g := NewWithT(t)
		gi := e.ownGuestIngress(t, "edited", "10.98.130.20")
		g.Expect(e.tenant.Create(e.ctx, gi)).To(Succeed())
		e.eventuallyAdmitted(t, gi, metav1.ConditionTrue)
		svc := e.eventuallyHostService(t, gi)
		want := svc.Spec.Selector
		g.Expect(want).To(HaveKeyWithValue(virtlauncher.KubeVirtLabel, virtlauncher.LauncherValue))
		g.Expect(update(e.ctx, e.tenant, svc, func() *corev1.Service { return &corev1.Service{} }, func(s *corev1.Service) {
			s.Spec.Selector = map[string]string{"app": "anything-of-mine"}
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.Ports[0].TargetPort = intstr.FromInt32(22)
			s.Spec.ExternalIPs = []string{"10.98.130.99"}
			s.Annotations[ingress.LBIPAMIPsAnnotation] = "10.98.130.20,10.97.0.1"
			s.Annotations["lbipam.cilium.io/sharing-key"] = "victim"
			s.Labels["example.com/pool"] = "infra"
			s.Labels[ownership.ClusterNameLabel] = "victim"
		})).To(Succeed(), "Kubernetes' admin role lets the tenant edit Services of its namespace")
		g.Eventually(func(g Gomega) {
			got := &corev1.Service{}
			g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
			g.Expect(got.Spec.Selector).To(Equal(want))
			g.Expect(got.Spec.ExternalTrafficPolicy).To(Equal(corev1.ServiceExternalTrafficPolicyCluster))
			g.Expect(got.Spec.Ports[0].TargetPort).To(Equal(svc.Spec.Ports[0].TargetPort))
			g.Expect(got.Spec.HealthCheckNodePort).To(BeZero())
			g.Expect(got.Spec.ExternalIPs).To(BeEmpty())
			g.Expect(got.Annotations).To(HaveKeyWithValue(ingress.LBIPAMIPsAnnotation, "10.98.130.20"), "only the admitted IP is requested")
			g.Expect(got.Annotations).NotTo(HaveKey("lbipam.cilium.io/sharing-key"))
			g.Expect(got.Labels).NotTo(HaveKey("example.com/pool"))
			g.Expect(got.Labels).To(HaveKeyWithValue(ownership.ClusterNameLabel, e.gc.Name))
		}).WithTimeout(giTimeout).Should(Succeed(), "guestnet puts back what it sets on its host Service and takes off what the policy does not admit")
	})

	// The admin's own mistake: a policy that would pass LB-IPAM's keys, guestnet's marks or
	// every address to a tenant is rejected by the API server.
	t.Run("admin-allows-a-forbidden-key", func(t *testing.T) {
		for name, mutate := range map[string]func(*guestnetv1.GuestIngressPolicy){
			"lbipam-annotation": func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.AllowedAnnotationKeys = []string{"lbipam.cilium.io/*"}
			},
			"cluster-name-label": func(p *guestnetv1.GuestIngressPolicy) {
				p.Spec.HostService.AllowedLabelKeys = []string{ownership.ClusterNameLabel}
			},
			"everything": func(p *guestnetv1.GuestIngressPolicy) { p.Spec.Addresses = []string{"0.0.0.0/0"} },
		} {
			p := &guestnetv1.GuestIngressPolicy{
				ObjectMeta: metav1.ObjectMeta{Name: "mistake-" + name + "-" + e.ns},
				Spec: guestnetv1.GuestIngressPolicySpec{
					NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: e.ns}},
					Addresses:         []string{"10.98.130.0/24"},
					L2Announcement:    &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$"}},
				},
			}
			mutate(p)
			err := e.host.Create(e.ctx, p)
			NewWithT(t).Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%s: the API server rejects it: %v", name, err)
		}
	})

	// Another tenant, offered the same shared pool, asks for an IP this tenant holds: it gets
	// nothing, and this tenant keeps the IP.
	t.Run("shared-pool-ip-of-another-tenant", func(t *testing.T) {
		g := NewWithT(t)
		holder := e.ownGuestIngress(t, "holder", "10.98.131.5")
		holder.Spec.LoadBalancer.PoolRef = &guestnetv1.PoolReference{Name: shared}
		g.Expect(e.tenant.Create(e.ctx, holder)).To(Succeed())
		e.eventuallyAdmitted(t, holder, metav1.ConditionTrue)
		g.Eventually(func() string { return getGuestIngress(t, e.l, holder).Status.LoadBalancerIP }).WithTimeout(giTimeout).Should(Equal("10.98.131.5"))

		other := uniqueName("sec")
		g.Expect(e.host.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other, Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
		e.createPolicy("other", func(p *guestnetv1.GuestIngressPolicy) {
			p.Spec.NamespaceSelector = metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: other}}
			p.Spec.Addresses = []string{"10.98.131.0/28"}
			p.Spec.SharedPools = []string{shared}
		})
		live := ingress.NewPool()
		g.Expect(e.host.Get(e.ctx, client.ObjectKey{Name: shared}, live)).To(Succeed())
		live.Object["spec"].(map[string]any)["serviceSelector"] = map[string]any{"matchExpressions": []any{map[string]any{
			"key": ingress.ServiceNamespaceKey, "operator": "In", "values": []any{e.ns, other}}}}
		g.Expect(e.host.Update(e.ctx, live)).To(Succeed(), "the admin shares the pool with the other namespace")

		tenantB := tenantClient(t, e.l, other)
		gc := createIngressCluster(t, e.l, other, "tenant-b", e.nodePort(2), e.nodePort(3))
		labelForFilter(t, e.l, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: gc.Name}}, e.filter)
		guestSvc := createContourService(t, e.l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
		taker := newGuestIngress(other, "taker", gc.Name, guestSvc, "10.98.131.5", ptr.To(e.nodePort(2)), ptr.To(e.nodePort(3)))
		taker.Labels = map[string]string{clusterv1.WatchLabel: e.filter}
		taker.Spec.LoadBalancer.PoolRef = &guestnetv1.PoolReference{Name: shared}
		g.Expect(tenantB.Create(e.ctx, taker)).To(Succeed())

		g.Eventually(func(g Gomega) {
			got := getGuestIngress(t, e.l, taker)
			c := conditions.Get(got, guestnetv1.LoadBalancerReadyCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(guestnetv1.IPConflictReason))
		}).WithTimeout(giTimeout).Should(Succeed())
		e.expectNothingOnTheHost(t, taker)
		g.Consistently(func() string { return getGuestIngress(t, e.l, holder).Status.LoadBalancerIP }).
			WithTimeout(3*time.Second).Should(Equal("10.98.131.5"), "the holder keeps its IP")
	})
}

// ownGuestIngress is newGuestIngress with a guest Service of its own (a guest Service has one
// GuestIngress) on nodePorts of its own, whose ports guestnet does not declare on the workers
// (no rollout: these tests are about the host objects). The nodePorts are the test's own 4..9
// and those of 10.98.131 (10..19), which no test environment uses (the pool's network here).
func (e *securityEnv) ownGuestIngress(t *testing.T, name, ip string) *guestnetv1.GuestIngress {
	t.Helper()
	i := int32(len(e.ownGuestServices))
	if i > 7 {
		t.Fatalf("ownGuestIngress: out of nodePorts")
	}
	http, https := e.nodePort(4+2*i), e.nodePort(5+2*i)
	svc := createContourService(t, e.l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	e.ownGuestServices = append(e.ownGuestServices, svc)
	gi := newGuestIngress(e.ns, name, e.gc.Name, svc, ip, ptr.To(http), ptr.To(https))
	gi.Labels = map[string]string{clusterv1.WatchLabel: e.filter}
	gi.Spec.DeclarePorts = ptr.To(false)
	return gi
}

// eventuallyAdmittedEither waits until the GuestIngress's Admitted condition is decided.
func (e *securityEnv) eventuallyAdmittedEither(t *testing.T, gi *guestnetv1.GuestIngress) metav1.Condition {
	t.Helper()
	var c metav1.Condition
	NewWithT(t).Eventually(func() bool {
		c = e.admitted(gi)
		return c.Status == metav1.ConditionTrue || c.Status == metav1.ConditionFalse
	}).WithTimeout(giTimeout).Should(BeTrue(), "Admitted of %s", gi.Name)
	return c
}
