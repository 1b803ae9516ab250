package e2e

// Held within admitted (docs/decisions/0008-held-within-admitted.md), tried by a tenant: every
// switch a tenant can set beside the spec (pause the GuestIngress or its Cluster, move the
// GuestIngress out of the manager's watch filter, make the spec invalid, have a change refused,
// make its guest unreachable, remove guestnet's finalizer and delete the GuestIngress) is set,
// then the host admin narrows and deletes the policy. What must not have happened is checked:
// a pool, L2 announcement policy or host Service left outside what is admitted, the IP still
// answering through the Cilium stand-in's announcement, Admitted still True. The manager runs
// as a ServiceAccount with the generated RBAC, the tenant holds only Kubernetes' admin role in
// its namespace (and the right to edit its Clusters, which a tenant of Cluster API has), and
// NO admission policy is installed: guestnet holds on its own; the optional policies
// (config/admission) are the second line.
//
// Run with: make test TEST_PKGS=./e2e/... TEST_ARGS='-run TestSecurity_TenantSwitches -v'

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// A tenant sets a switch, then the host admin narrows the policy (one interface less: the
// GuestIngress stays admitted; then an address range without its IP: it is not) and deletes
// it. Whatever the switch, nothing is held beyond what is admitted at each step.
func TestSecurity_TenantSwitchesKeepNothingThePolicyRevokes(t *testing.T) {
	e := newHeldEnv(t)
	for i, sc := range []heldScenario{
		{name: "pause-guestingress", kept: true, flip: func(t *testing.T, c *heldCase) {
			c.patchGuestIngress(t, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":"true"}}}`)
			c.eventuallyCondition(t, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
		}},
		{name: "pause-cluster", kept: true, flip: func(t *testing.T, c *heldCase) {
			c.patchCluster(t, `{"spec":{"paused":true}}`)
			c.eventuallyCondition(t, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
		}},
		{name: "pause-cluster-annotation", kept: true, flip: func(t *testing.T, c *heldCase) {
			c.patchCluster(t, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":""}}}`)
			c.eventuallyCondition(t, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
		}},
		{name: "watch-filter-changed", flip: func(t *testing.T, c *heldCase) {
			c.patchGuestIngress(t, `{"metadata":{"labels":{"cluster.x-k8s.io/watch-filter":"elsewhere"}}}`)
		}},
		{name: "watch-filter-removed", flip: func(t *testing.T, c *heldCase) {
			c.patchGuestIngress(t, `{"metadata":{"labels":{"cluster.x-k8s.io/watch-filter":null}}}`)
		}},
		{name: "invalid-spec", kept: true, flip: func(t *testing.T, c *heldCase) {
			// A label key the policy allows with a value no Service may carry: admission
			// (the CRD, the policy) lets it through, guestnet cannot build from it.
			c.patchGuestIngress(t, `{"spec":{"loadBalancer":{"labels":{"example.com/tier":"not a label value!"}}}}`)
			c.eventuallyCondition(t, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.InvalidSpecReason)
		}},
		{name: "refused-ip-change", kept: true, refused: true, flip: func(t *testing.T, c *heldCase) {
			// Another GuestIngress of the namespace holds .20; the change to it is refused, and
			// the host objects of .10 stay as they are.
			c.patchGuestIngress(t, fmt.Sprintf(`{"spec":{"loadBalancer":{"ip":%q}}}`, c.ip(20)))
			c.eventuallyCondition(t, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.IPConflictReason)
		}},
		{name: "unreachable-guest", kept: true, unreachable: true, flip: func(t *testing.T, c *heldCase) {
			// The tenant, admin of its guest, revokes the credential guestnet's kubeconfig
			// Secret holds: the ClusterCache disconnects and cannot connect again.
			c.revokeGuestCredential(t)
			c.eventuallyCondition(t, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.GuestUnreachableReason)
		}},
		{name: "finalizer-removed", flip: func(t *testing.T, c *heldCase) {
			c.patchGuestIngress(t, `{"metadata":{"finalizers":null}}`)
			NewWithT(t).Expect(c.tenant.Delete(c.e.ctx, c.gi)).To(Succeed())
			NewWithT(t).Eventually(func() bool {
				return apierrors.IsNotFound(c.e.host.Get(c.e.ctx, client.ObjectKeyFromObject(c.gi), &guestnetv1.GuestIngress{}))
			}).WithTimeout(giTimeout).Should(BeTrue(), "gone at once: nothing holds it")
		}},
	} {
		t.Run(sc.name, func(t *testing.T) { e.run(t, i, sc) })
	}
}

// heldScenario is one switch a tenant sets.
type heldScenario struct {
	name string
	flip func(t *testing.T, c *heldCase)
	// kept: guestnet still serves the GuestIngress after the switch, and it keeps what the
	// policy still admits; else (watch filter, finalizer) what this manager made goes at once.
	kept bool
	// refused: the GuestIngress now asks for .20, which another one holds.
	refused bool
	// unreachable: the guest is reached with a ServiceAccount token the tenant can revoke.
	unreachable bool
}

// heldEnv is one manager (as a ServiceAccount with the generated RBAC, watch filter of its
// own) and the Cilium stand-in, shared by the scenarios; each scenario has a namespace,
// tenant, Cluster, worker, policy and address range of its own.
type heldEnv struct {
	l      *lab.Lab
	ctx    context.Context
	host   client.Client
	filter string
}

func newHeldEnv(t *testing.T) *heldEnv {
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // all the scenarios
	t.Cleanup(cancel)
	e := &heldEnv{l: l, ctx: ctx, host: l.Host.Client}
	ns := uniqueName("held")
	e.filter = ns
	NewWithT(t).Expect(e.host.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	installTenantRoles(t, l)
	m := runManagerAsServiceAccount(t, l, ns, lab.ManagerFlags{WatchFilter: e.filter})
	t.Cleanup(func() {
		for _, line := range strings.Split(m.Log(), "\n") {
			if strings.Contains(line, "forbidden") {
				t.Errorf("the manager was refused a request: the generated RBAC lacks a rule: %s", line)
			}
		}
	})
	startCiliumStandIn(t, l)
	return e
}

// heldCase is one scenario's world: its addresses are 10.98.(130+i).0/24, its guest nodePorts
// 32400+10i and the nine after, its worker 10.244.93.(10+i).
type heldCase struct {
	e      *heldEnv
	i      int
	ns     string
	tenant client.Client
	gc     *lab.GuestCluster
	policy *guestnetv1.GuestIngressPolicy
	gi     *guestnetv1.GuestIngress
	// guestSA is the guest ServiceAccount whose token the kubeconfig Secret holds
	// (unreachable scenario).
	guestSA *corev1.ServiceAccount
}

func (c *heldCase) ip(host int) string   { return fmt.Sprintf("10.98.%d.%d", 130+c.i, host) }
func (c *heldCase) nodePort(j int) int32 { return int32(32400 + 10*c.i + j) }

func (e *heldEnv) run(t *testing.T, i int, sc heldScenario) {
	g := NewWithT(t)
	c := e.newCase(t, i, sc)
	ip := c.ip(10)
	g.Eventually(func() (string, error) { return lab.Get(e.ctx, ip, 80) }).WithTimeout(giTimeout).Should(Equal(c.gc.Name+"-worker"),
		"the IP answers through the announcement before the switch")

	sc.flip(t, c)

	if !sc.kept {
		// Not this manager's any more (or gone): what it made goes now, whatever the policy.
		c.eventuallyNothingHeld(t, ip)
	}

	// 1. The admin narrows the announcement to one interface: the GuestIngress is still
	// admitted (it names none), and announces on that one only.
	g.Expect(updatePolicy(e.ctx, e.host, c.policy, func(p *guestnetv1.GuestIngressPolicy) {
		p.Spec.L2Announcement.Interfaces = []string{"^eth0$"}
	})).To(Succeed())
	if sc.kept {
		g.Eventually(func(g Gomega) {
			l2 := ingress.NewL2Policy()
			g.Expect(e.host.Get(e.ctx, client.ObjectKey{Name: hostnames.L2Policy(c.gi)}, l2)).To(Succeed())
			g.Expect(l2.Object["spec"]).To(HaveKeyWithValue("interfaces", []any{"^eth0$"}), "announced on interfaces the policy no longer allows")
		}).WithTimeout(giTimeout).Should(Succeed())
		g.Expect(c.admitted(t).Status).To(Equal(metav1.ConditionTrue))
		g.Expect(e.host.Get(e.ctx, client.ObjectKey{Name: hostnames.Pool(c.gi)}, ingress.NewPool())).To(Succeed(), "what is still admitted stays")
	} else {
		c.expectNothingHeld(t, ip)
	}

	// 2. The admin narrows the addresses: .10 is no longer admitted (.20 still is).
	g.Expect(updatePolicy(e.ctx, e.host, c.policy, func(p *guestnetv1.GuestIngressPolicy) {
		p.Spec.Addresses = []string{c.ip(16) + "/28"}
	})).To(Succeed())
	switch {
	case sc.refused:
		// It asks for .20 now, which is admitted (and held by the other one): it stays
		// admitted, and what it held of .10 goes.
		g.Eventually(func() error {
			return e.host.Get(e.ctx, client.ObjectKey{Name: hostnames.Pool(c.gi)}, ingress.NewPool())
		}).WithTimeout(giTimeout).Should(Satisfy(apierrors.IsNotFound), "the pool of .10 stays after .10 was revoked")
		c.eventuallyNotServed(t, ip)
		c.expectNoServiceHolds(t, ip)
		g.Expect(c.admitted(t).Status).To(Equal(metav1.ConditionTrue))
	case sc.kept:
		a := c.eventuallyNotAdmitted(t, guestnetv1.NotAllowedReason)
		g.Expect(a.Message).To(ContainSubstring("does not allow IP %s", ip))
		c.eventuallyNothingHeld(t, ip)
	default:
		c.expectNothingHeld(t, ip)
	}

	// 3. The admin deletes the policy: nothing at all.
	g.Expect(e.host.Delete(e.ctx, c.policy)).To(Succeed())
	if sc.kept {
		c.eventuallyNotAdmitted(t, guestnetv1.NoPolicyReason)
	}
	c.eventuallyNothingHeld(t, ip)

	if sc.name == "finalizer-removed" {
		// The tenant makes a LoadBalancer Service of its own under the old host Service's
		// name, asking for the IP: no pool of guestnet's gives it one any more. (An admin's
		// pool for another namespace keeps LB-IPAM deciding: it is dormant while no pool
		// exists.)
		other := poolObject("other-"+c.ns, map[string]any{"matchLabels": map[string]any{ingress.ServiceNamespaceKey: "nobody"}}, c.ip(240)+"/28")
		g.Expect(e.host.Create(e.ctx, other)).To(Succeed())
		t.Cleanup(func() { _ = e.host.Delete(context.Background(), other) })
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: hostnames.HostService(c.gi), Annotations: map[string]string{ingress.LBIPAMIPsAnnotation: ip}},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerClass: ptr.To(guestnetv1.DefaultLoadBalancerClass),
				AllocateLoadBalancerNodePorts: ptr.To(false), Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}
		g.Expect(c.tenant.Create(e.ctx, svc)).To(Succeed())
		g.Eventually(func(g Gomega) {
			got := &corev1.Service{}
			g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(svc), got)).To(Succeed())
			ipam := meta.FindStatusCondition(got.Status.Conditions, ingress.IPAMRequestSatisfiedCondition)
			g.Expect(ipam).NotTo(BeNil(), "LB-IPAM has decided")
			g.Expect(got.Status.LoadBalancer.Ingress).To(BeEmpty(), "the tenant's own Service got the IP of the swept pool")
			g.Expect(ipam.Status).To(Equal(metav1.ConditionFalse), "%s: %s", ipam.Reason, ipam.Message)
		}).WithTimeout(giTimeout).Should(Succeed())
	}
}

// newCase makes scenario i's namespace, tenant, Cluster (with a worker serving the Envoy
// stand-in), guest Service, policy and GuestIngress web (IP .10, created by the tenant), and
// waits until the IP has its host objects.
func (e *heldEnv) newCase(t *testing.T, i int, sc heldScenario) *heldCase {
	g := NewWithT(t)
	c := &heldCase{e: e, i: i, ns: uniqueName("held-" + sc.name)}
	g.Expect(e.host.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns,
		Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	c.tenant = tenantClient(t, e.l, c.ns)
	allowClusterWrites(t, e.l, c.ns, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant@" + c.ns})

	c.gc = createIngressCluster(t, e.l, c.ns, "tenant-"+fmt.Sprint(i), c.nodePort(0), c.nodePort(1))
	if sc.unreachable {
		c.useGuestServiceAccount(t)
	}
	labelForFilter(t, e.l, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.gc.Name}}, e.filter)
	w := addWorker(t, e.l, c.gc, c.gc.Name+"-worker", fmt.Sprintf("10.244.93.%d", 10+i))
	g.Expect(w.ServeMachineName(c.nodePort(0))).To(Succeed())
	guestSvc := createContourService(t, e.l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)

	c.policy = &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: c.ns, Labels: map[string]string{clusterv1.WatchLabel: e.filter}},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: c.ns}},
			Addresses:         []string{c.ip(0) + "/24"},
			L2Announcement:    &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$", "^eth1$"}},
			HostService: guestnetv1.HostServicePolicy{
				AllowedAnnotationKeys: []string{"example.com/*"},
				AllowedLabelKeys:      []string{"example.com/*"},
			},
		},
	}
	g.Expect(e.host.Create(e.ctx, c.policy)).To(Succeed())
	t.Cleanup(func() { _ = e.host.Delete(context.Background(), c.policy) })

	if sc.refused {
		holderSvc := createContourService(t, e.l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
		holder := newGuestIngress(c.ns, "holder", c.gc.Name, holderSvc, c.ip(20), ptr.To(c.nodePort(2)), ptr.To(c.nodePort(3)))
		holder.Labels = map[string]string{clusterv1.WatchLabel: e.filter}
		holder.Spec.LoadBalancer.L2 = nil
		g.Expect(c.tenant.Create(e.ctx, holder)).To(Succeed())
		g.Eventually(func() error {
			return e.host.Get(e.ctx, client.ObjectKey{Name: hostnames.Pool(holder)}, ingress.NewPool())
		}).WithTimeout(giTimeout).Should(Succeed(), "the holder holds .20")
	}

	c.gi = newGuestIngress(c.ns, "web", c.gc.Name, guestSvc, c.ip(10), ptr.To(c.nodePort(0)), ptr.To(c.nodePort(1)))
	c.gi.Labels = map[string]string{clusterv1.WatchLabel: e.filter}
	c.gi.Spec.LoadBalancer.L2 = nil // the policy's interfaces
	c.gi.Spec.LoadBalancer.Annotations = map[string]string{"example.com/team": "web"}
	g.Expect(c.tenant.Create(e.ctx, c.gi)).To(Succeed())
	c.eventuallyCondition(t, guestnetv1.AdmittedCondition, metav1.ConditionTrue, guestnetv1.AdmittedReason)
	g.Eventually(func(g Gomega) {
		l2 := ingress.NewL2Policy()
		g.Expect(e.host.Get(e.ctx, client.ObjectKey{Name: hostnames.L2Policy(c.gi)}, l2)).To(Succeed())
		g.Expect(l2.Object["spec"]).To(HaveKeyWithValue("interfaces", []any{"^eth0$", "^eth1$"}))
		svc := &corev1.Service{}
		g.Expect(e.host.Get(e.ctx, client.ObjectKey{Namespace: c.ns, Name: hostnames.HostService(c.gi)}, svc)).To(Succeed())
		g.Expect(ingress.LoadBalancerIP(svc)).To(Equal(c.ip(10)))
	}).WithTimeout(giTimeout).Should(Succeed())
	return c
}

func (c *heldCase) patchGuestIngress(t *testing.T, patch string) {
	t.Helper()
	NewWithT(t).Expect(c.tenant.Patch(c.e.ctx, c.gi.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed(), "the tenant's RBAC allows it")
}

func (c *heldCase) patchCluster(t *testing.T, patch string) {
	t.Helper()
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: c.gc.Name}}
	NewWithT(t).Expect(c.tenant.Patch(c.e.ctx, cluster, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed(), "the tenant's RBAC allows it")
}

func (c *heldCase) condition(t *testing.T, conditionType string) metav1.Condition {
	t.Helper()
	got := &guestnetv1.GuestIngress{}
	if err := c.e.host.Get(c.e.ctx, client.ObjectKeyFromObject(c.gi), got); err != nil {
		return metav1.Condition{}
	}
	if cond := conditions.Get(got, conditionType); cond != nil {
		return *cond
	}
	return metav1.Condition{}
}

func (c *heldCase) admitted(t *testing.T) metav1.Condition {
	return c.condition(t, guestnetv1.AdmittedCondition)
}

func (c *heldCase) eventuallyCondition(t *testing.T, conditionType string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	NewWithT(t).Eventually(func() []string {
		got = c.condition(t, conditionType)
		return []string{string(got.Status), got.Reason}
	}).WithTimeout(giTimeout).WithPolling(100*time.Millisecond).Should(Equal([]string{string(status), reason}), "%s: %s", conditionType, got.Message)
	return got
}

// eventuallyNotAdmitted waits for Admitted=False with reason, and Ready saying so.
func (c *heldCase) eventuallyNotAdmitted(t *testing.T, reason string) metav1.Condition {
	t.Helper()
	a := c.eventuallyCondition(t, guestnetv1.AdmittedCondition, metav1.ConditionFalse, reason)
	c.eventuallyCondition(t, guestnetv1.ReadyCondition, metav1.ConditionFalse, reason)
	return a
}

// eventuallyNothingHeld waits until the GuestIngress holds nothing on the host, then checks
// that nothing answers on the IP.
func (c *heldCase) eventuallyNothingHeld(t *testing.T, ip string) {
	t.Helper()
	NewWithT(t).Eventually(func(g Gomega) { c.nothingHeld(g, ip) }).WithTimeout(giTimeout).Should(Succeed())
	c.eventuallyNotServed(t, ip)
}

// expectNothingHeld checks that the GuestIngress holds nothing on the host now.
func (c *heldCase) expectNothingHeld(t *testing.T, ip string) {
	t.Helper()
	c.nothingHeld(NewWithT(t), ip)
	c.eventuallyNotServed(t, ip)
}

// nothingHeld: no pool, L2 announcement policy or host Service of the GuestIngress (read
// from the apiserver as the admin), and no Service of the namespace has or asks for the IP.
func (c *heldCase) nothingHeld(g Gomega, ip string) {
	for _, obj := range []*unstructured.Unstructured{ingress.NewPool(), ingress.NewL2Policy()} {
		err := c.e.host.Get(c.e.ctx, client.ObjectKey{Name: hostnames.Pool(c.gi)}, obj)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s %s is left: %v", obj.GetKind(), hostnames.Pool(c.gi), obj.Object["spec"])
	}
	svc := &corev1.Service{}
	err := c.e.host.Get(c.e.ctx, client.ObjectKey{Namespace: c.ns, Name: hostnames.HostService(c.gi)}, svc)
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "host Service %s is left", hostnames.HostService(c.gi))
	c.noServiceHolds(g, ip)
}

func (c *heldCase) expectNoServiceHolds(t *testing.T, ip string) {
	t.Helper()
	c.noServiceHolds(NewWithT(t), ip)
}

func (c *heldCase) noServiceHolds(g Gomega, ip string) {
	list := &corev1.ServiceList{}
	g.Expect(c.e.host.List(c.e.ctx, list, client.InNamespace(c.ns))).To(Succeed())
	for _, s := range list.Items {
		g.Expect(ingress.LoadBalancerIP(&s)).NotTo(Equal(ip), "Service %s has the IP", s.Name)
		g.Expect(strings.Split(s.Annotations[ingress.LBIPAMIPsAnnotation], ",")).NotTo(ContainElement(ip), "Service %s asks for the IP", s.Name)
	}
}

// eventuallyNotServed waits until nothing answers on the IP: the Cilium stand-in no longer
// announces it.
func (c *heldCase) eventuallyNotServed(t *testing.T, ip string) {
	t.Helper()
	NewWithT(t).Eventually(func() error { _, err := lab.Get(c.e.ctx, ip, 80); return err }).WithTimeout(giTimeout).
		Should(HaveOccurred(), "the IP still answers")
}

// useGuestServiceAccount points the Cluster's kubeconfig Secret (before guestnet connects)
// at a guest ServiceAccount bound to cluster-admin, with a token from the TokenRequest API:
// a credential the tenant, admin of its guest, can revoke.
func (c *heldCase) useGuestServiceAccount(t *testing.T) {
	t.Helper()
	g := NewWithT(t)
	ctx, guest := c.e.ctx, c.e.l.Guest.Client
	c.guestSA = &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "guestnet-" + c.ns}}
	g.Expect(guest.Create(ctx, c.guestSA)).To(Succeed())
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "guestnet-" + c.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: c.guestSA.Namespace, Name: c.guestSA.Name}},
	}
	g.Expect(guest.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() { _ = guest.Delete(context.Background(), binding) })
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	g.Expect(guest.SubResource("token").Create(ctx, c.guestSA, tr)).To(Succeed())
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["guest"] = &clientcmdapi.Cluster{Server: c.e.l.Guest.Server(), CertificateAuthorityData: c.e.l.Guest.CA.CertPEM()}
	cfg.AuthInfos["guestnet"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["guest"] = &clientcmdapi.Context{Cluster: "guest", AuthInfo: "guestnet"}
	cfg.CurrentContext = "guest"
	kubeconfig, err := clientcmd.Write(*cfg)
	g.Expect(err).NotTo(HaveOccurred())
	secret := &corev1.Secret{}
	g.Expect(c.e.host.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: c.gc.Name + "-kubeconfig"}, secret)).To(Succeed())
	secret.Data = map[string][]byte{"value": kubeconfig}
	g.Expect(c.tenant.Update(ctx, secret)).To(Succeed(), "the tenant may write its kubeconfig Secret (no admission policy)")
}

// revokeGuestCredential deletes the guest ServiceAccount whose token guestnet uses: the guest
// apiserver answers 401 from then on.
func (c *heldCase) revokeGuestCredential(t *testing.T) {
	t.Helper()
	NewWithT(t).Expect(c.e.l.Guest.Client.Delete(c.e.ctx, c.guestSA)).To(Succeed())
}
