package e2e

// Tenant safety (docs/security.md): every attack of the threat model's table, tried by a
// tenant identity that holds only Kubernetes' `admin` role in its namespace (guestnet's tenant
// roles aggregated into it, config/rbac/tenant_roles.yaml), against guestnet's manager running
// as a ServiceAccount with exactly the generated RBAC. Each refused GuestIngress says why
// (Admitted=False, naming what is not allowed), and nothing exists on the host for it.
//
// The namespaces of these tests opt out of the lab-wide policy (lab.NoLabPolicyLabel): the
// only policies that select them are the ones the tests write.
//
// Run with: make test TEST_PKGS=./e2e/... TEST_ARGS='-run TestSecurity -v'

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/exp/topology"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/diagnose"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/feature"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	admission "github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// The attacks of docs/security.md's table that a GuestIngress spec carries. Each is a
// GuestIngress a tenant creates in a namespace whose policy admits 10.98.80.0/24, Cilium's L2
// announcer on ^eth0$, annotations example.com/*, Cluster traffic, and offers one shared pool
// that selects by a label (unsafe) and none that selects by namespace.
func TestSecurity_TenantAttacksGetNothingOnTheHost(t *testing.T) {
	e := newSecurityEnv(t, "10.98.80")
	policy := e.createPolicy("attacks", func(p *guestnetv1.GuestIngressPolicy) {
		p.Spec.SharedPools = []string{"unsafe-" + e.ns}
	})
	e.createPool("unsafe-"+e.ns, map[string]any{"matchLabels": map[string]any{ownership.ClusterNameLabel: e.gc.Name}}, "10.98.81.0/28")
	e.createPool("infra-"+e.ns, map[string]any{"matchLabels": map[string]any{"example.com/pool": "infra-" + e.ns}}, "10.98.82.0/28")
	// Another tenant's pool, selected by the cluster-name label: guestnet puts that label on
	// every host Service, with the value the tenant chose for its Cluster.
	victim := "victim-" + e.ns
	e.createPool(victim, map[string]any{"matchLabels": map[string]any{ownership.ClusterNameLabel: victim}}, "10.98.83.0/28")
	victimCluster := createIngressCluster(t, e.l, e.ns, victim, e.nodePort(0), e.nodePort(1))
	labelForFilter(t, e.l, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: victimCluster.Name}}, e.filter)

	attacks := []struct {
		name    string
		cluster string
		mutate  func(*guestnetv1.LoadBalancerSpec)
		reason  string
		message string
		// never: what the message must not name (another tenant's objects).
		never string
	}{
		{name: "ip-host-vip", mutate: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP = "10.97.0.1" },
			message: "does not allow IP 10.97.0.1 (its addresses: 10.98.80.0/24)"},
		{name: "cidrs-everything", mutate: func(lb *guestnetv1.LoadBalancerSpec) { lb.IP, lb.CIDRs = "", []string{"0.0.0.0/0"} },
			message: "range 0.0.0.0/0 (its addresses: 10.98.80.0/24)"},
		{name: "arp-on-mgmt", mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			lb.L2 = &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^mgmt0$"}}
		}, message: "announcing on interface ^mgmt0$ (it allows ^eth0$)"},
		{name: "bgp-class", mutate: func(lb *guestnetv1.LoadBalancerSpec) { lb.Class = "io.cilium/bgp-control-plane" },
			message: "loadBalancerClass io.cilium/bgp-control-plane (it allows io.cilium/l2-announcer)"},
		{name: "lbipam-ips", mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			lb.Annotations = map[string]string{"lbipam.cilium.io/ips": "10.97.0.1"}
		}, message: "annotation lbipam.cilium.io/ips (guestnet never passes it to a host Service)"},
		{name: "lbipam-sharing", mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			lb.Annotations = map[string]string{"lbipam.cilium.io/sharing-key": "victim", "lbipam.cilium.io/sharing-cross-namespace": "*"}
		}, message: "annotation lbipam.cilium.io/sharing-cross-namespace (guestnet never passes it"},
		{name: "external-dns", mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			lb.Annotations = map[string]string{"external-dns.alpha.kubernetes.io/hostname": "www.bank.example"}
		}, message: "annotation external-dns.alpha.kubernetes.io/hostname (it allows example.com/*)"},
		{name: "label-of-admin-pool", mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			lb.Labels = map[string]string{"example.com/pool": "infra-" + e.ns}
		}, message: "label example.com/pool (it allows none)"},
		{name: "poolref-not-offered", mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			lb.IP, lb.PoolRef = "", &guestnetv1.PoolReference{Name: "infra-" + e.ns}
		}, message: fmt.Sprintf("shared pool infra-%s (it offers unsafe-%s)", e.ns, e.ns)},
		{name: "poolref-unsafe", mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			lb.IP, lb.PoolRef = "10.98.81.3", &guestnetv1.PoolReference{Name: "unsafe-" + e.ns}
		}, message: "whose serviceSelector does not select Services by namespace"},
		{name: "cluster-named-like-victim", cluster: victim, mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			lb.IP, lb.CIDRs = "", []string{"10.98.80.16/29"}
		}, message: "while a pool of the platform selects its host Service and could hand it out", never: victim},
		{name: "traffic-local", mutate: func(lb *guestnetv1.LoadBalancerSpec) {
			// Local needs a BGP or MetalLB class (the CRD refuses it with Cilium's L2 one).
			lb.ExternalTrafficPolicy, lb.Class, lb.L2 = corev1.ServiceExternalTrafficPolicyLocal, "io.cilium/bgp-control-plane", nil
		},
			message: "externalTrafficPolicy Local (it allows Cluster; Local opens a health-check nodePort on every host node)"},
	}
	var created []*guestnetv1.GuestIngress
	for i, a := range attacks {
		gi := e.newGuestIngress(a.name, fmt.Sprintf("10.98.80.%d", 100+i))
		if a.cluster != "" {
			gi.Spec.ClusterName = a.cluster
		}
		a.mutate(&gi.Spec.LoadBalancer)
		e.g.Expect(e.tenant.Create(e.ctx, gi)).To(Succeed(), "the tenant may create GuestIngresses (%s)", a.name)
		created = append(created, gi)
	}
	for i, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			c := e.eventuallyAdmitted(t, created[i], metav1.ConditionFalse)
			g := NewWithT(t)
			g.Expect(c.Reason).To(Equal(cmp.Or(a.reason, guestnetv1.NotAllowedReason)))
			g.Expect(c.Message).To(ContainSubstring(a.message))
			if a.never != "" {
				g.Expect(c.Message).NotTo(ContainSubstring(a.never))
			}
			g.Expect(c.Message).To(ContainSubstring("GuestIngressPolicy %s", policy.Name))
			g.Expect(c.Message).To(ContainSubstring("guestnet creates nothing on the host"))
			e.expectNothingOnTheHost(t, created[i])
		})
	}

	// What the policy does admit gets its host objects, and the host Service opens no
	// nodePort on the host nodes.
	t.Run("admitted", func(t *testing.T) {
		gi := e.newGuestIngress("admitted", "10.98.80.10")
		gi.Spec.LoadBalancer.Annotations = map[string]string{"example.com/team": "web"}
		NewWithT(t).Expect(e.tenant.Create(e.ctx, gi)).To(Succeed())
		c := e.eventuallyAdmitted(t, gi, metav1.ConditionTrue)
		NewWithT(t).Expect(c.Message).To(Equal(fmt.Sprintf("GuestIngressPolicy %s admits 10.98.80.10", policy.Name)))
		svc := e.eventuallyHostService(t, gi)
		e.expectNoHostNodePort(t, svc)
		l2 := e.getCilium(t, ingress.NewL2Policy(), hostnames.L2Policy(gi))
		NewWithT(t).Expect(l2.Object["spec"]).To(HaveKeyWithValue("interfaces", []any{"^eth0$"}))
	})

	// The tenant's identity can do nothing to the policies, the pools or any status.
	t.Run("tenant-rbac", func(t *testing.T) {
		g := NewWithT(t)
		forbidden := func(err error) { g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "%v", err) }
		forbidden(e.tenant.Create(e.ctx, &guestnetv1.GuestIngressPolicy{ObjectMeta: metav1.ObjectMeta{Name: "mine-" + e.ns}}))
		forbidden(e.tenant.Get(e.ctx, client.ObjectKeyFromObject(policy), &guestnetv1.GuestIngressPolicy{}))
		forbidden(e.tenant.List(e.ctx, &guestnetv1.GuestIngressPolicyList{}))
		p := policy.DeepCopy()
		p.Spec.Addresses = []string{"10.0.0.0/8"}
		forbidden(e.tenant.Update(e.ctx, p))
		forbidden(e.tenant.Delete(e.ctx, policy))
		forbidden(e.tenant.Create(e.ctx, poolObject("mine-"+e.ns, nil, "10.2.6.0/24")))

		// Its own GuestIngress: the status is guestnet's, the tenant cannot write it.
		gi := &guestnetv1.GuestIngress{}
		g.Expect(e.tenant.Get(e.ctx, client.ObjectKeyFromObject(created[0]), gi)).To(Succeed(), "the tenant reads its GuestIngresses")
		gi.Status.Conditions = []metav1.Condition{{Type: guestnetv1.AdmittedCondition, Status: metav1.ConditionTrue, Reason: guestnetv1.AdmittedReason, LastTransitionTime: metav1.Now()}}
		forbidden(e.tenant.Status().Update(e.ctx, gi))
		forbidden(e.tenant.Status().Patch(e.ctx, gi, client.Merge))
	})
}

// The per-namespace cap admits the oldest; the newer one gets QuotaExceeded and nothing on
// the host until the older one goes. A policy that stops admitting a GuestIngress takes its
// host objects away.
func TestSecurity_CapAndRevocation(t *testing.T) {
	e := newSecurityEnv(t, "10.98.84")
	policy := e.createPolicy("cap", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.MaxGuestIngressesPerNamespace = ptr.To[int32](1) })

	first := e.newGuestIngress("first", "10.98.84.10")
	e.g.Expect(e.tenant.Create(e.ctx, first)).To(Succeed())
	e.eventuallyAdmitted(t, first, metav1.ConditionTrue)
	e.eventuallyHostService(t, first)
	time.Sleep(1100 * time.Millisecond) // creationTimestamps have a resolution of a second: second is newer
	second := e.newGuestIngress("second", "10.98.84.11")
	e.g.Expect(e.tenant.Create(e.ctx, second)).To(Succeed())
	c := e.eventuallyAdmitted(t, second, metav1.ConditionFalse)
	e.g.Expect(c.Reason).To(Equal(guestnetv1.QuotaExceededReason))
	e.g.Expect(c.Message).To(ContainSubstring("GuestIngressPolicy %s admits at most 1 GuestIngresses in namespace %s and admits the older first", policy.Name, e.ns))
	e.expectNothingOnTheHost(t, second)

	// The policy's status lists what it admits.
	e.g.Eventually(func(g Gomega) {
		got := &guestnetv1.GuestIngressPolicy{}
		g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(policy), got)).To(Succeed())
		g.Expect(got.Status.Selector).To(Equal(corev1.LabelMetadataName + "=" + e.ns))
		g.Expect(got.Status.Namespaces).To(BeEquivalentTo(1))
		g.Expect(got.Status.AdmittedGuestIngresses).To(BeEquivalentTo(1))
		g.Expect(got.Status.GuestIngresses).To(Equal([]guestnetv1.AdmittedGuestIngress{{Namespace: e.ns, Name: "first", Claim: "10.98.84.10"}}))
		g.Expect(conditions.IsTrue(got, guestnetv1.ReadyCondition)).To(BeTrue())
	}).WithTimeout(giTimeout).Should(Succeed())

	// The older one goes: the newer one is admitted.
	e.g.Expect(e.tenant.Delete(e.ctx, first)).To(Succeed())
	e.eventuallyAdmitted(t, second, metav1.ConditionTrue)
	svc := e.eventuallyHostService(t, second)

	// The admin narrows the policy: the GuestIngress loses its host objects.
	e.g.Expect(updatePolicy(e.ctx, e.host, policy, func(p *guestnetv1.GuestIngressPolicy) { p.Spec.Addresses = []string{"10.98.85.0/24"} })).To(Succeed())
	c = e.eventuallyAdmitted(t, second, metav1.ConditionFalse)
	e.g.Expect(c.Message).To(ContainSubstring("does not allow IP 10.98.84.11 (its addresses: 10.98.85.0/24)"))
	e.g.Eventually(func() bool {
		return apierrors.IsNotFound(e.host.Get(e.ctx, client.ObjectKeyFromObject(svc), &corev1.Service{}))
	}).WithTimeout(giTimeout).Should(BeTrue(), "the host Service is deleted")
	e.expectNothingOnTheHost(t, second)

	// No policy at all: NoPolicy.
	e.g.Expect(e.host.Delete(e.ctx, policy)).To(Succeed())
	c = e.eventuallyAdmitted(t, second, metav1.ConditionFalse)
	e.g.Eventually(func() string { return e.admitted(second).Reason }).WithTimeout(giTimeout).Should(Equal(guestnetv1.NoPolicyReason))
	e.g.Expect(e.admitted(second).Message).To(ContainSubstring("No GuestIngressPolicy selects namespace %s", e.ns))

	// `manager diagnose` says so, with the fix.
	rep := runDiagnoseJSON(t, e.l, e.ns, e.gc.Name, diagnose.ExitFail)
	r := result(t, rep, diagnose.CheckAdmission, "second")
	e.g.Expect(r.Verdict).To(Equal(diagnose.Fail))
	e.g.Expect(r.Detail).To(ContainSubstring("not admitted (NoPolicy): No GuestIngressPolicy selects namespace %s", e.ns))
	e.g.Expect(r.Fix).To(ContainSubstring("the host admin creates a GuestIngressPolicy whose namespaceSelector selects namespace %s", e.ns))
	e.g.Expect(r.Runbook).To(Equal("docs/runbook.md#ingress-not-admitted"))
}

// A shared pool that a tenant could match by a label is not usable: the policy says so
// (Ready=False) and a poolRef to it is refused; once the admin pins it to namespaces, the
// policy is Ready and the GuestIngress gets its IP from it.
func TestSecurity_SharedPoolMustSelectByNamespace(t *testing.T) {
	e := newSecurityEnv(t, "10.98.86")
	pool := "shared-" + e.ns
	policy := e.createPolicy("shared", func(p *guestnetv1.GuestIngressPolicy) { p.Spec.SharedPools = []string{pool} })
	e.createPool(pool, map[string]any{"matchLabels": map[string]any{ownership.ClusterNameLabel: e.gc.Name}}, "10.98.87.0/28")
	e.g.Eventually(func(g Gomega) {
		got := &guestnetv1.GuestIngressPolicy{}
		g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(policy), got)).To(Succeed())
		c := conditions.Get(got, guestnetv1.ReadyCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(guestnetv1.SharedPoolUnsafeReason))
		g.Expect(c.Message).To(ContainSubstring("never select by a label such as cluster.x-k8s.io/cluster-name"))
	}).WithTimeout(giTimeout).Should(Succeed())

	gi := e.newGuestIngress("web", "10.98.87.5")
	gi.Spec.LoadBalancer.PoolRef = &guestnetv1.PoolReference{Name: pool}
	e.g.Expect(e.tenant.Create(e.ctx, gi)).To(Succeed())
	c := e.eventuallyAdmitted(t, gi, metav1.ConditionFalse)
	e.g.Expect(c.Message).To(ContainSubstring("shared pool %s, whose serviceSelector does not select Services by namespace", pool))
	e.expectNothingOnTheHost(t, gi)

	live := ingress.NewPool()
	e.g.Expect(e.host.Get(e.ctx, client.ObjectKey{Name: pool}, live)).To(Succeed())
	live.Object["spec"].(map[string]any)["serviceSelector"] = map[string]any{"matchLabels": map[string]any{ingress.ServiceNamespaceKey: e.ns}}
	e.g.Expect(e.host.Update(e.ctx, live)).To(Succeed())
	e.eventuallyAdmitted(t, gi, metav1.ConditionTrue)
	e.g.Eventually(func() bool {
		got := &guestnetv1.GuestIngressPolicy{}
		return e.host.Get(e.ctx, client.ObjectKeyFromObject(policy), got) == nil && conditions.IsTrue(got, guestnetv1.ReadyCondition)
	}).WithTimeout(giTimeout).Should(BeTrue())
	err := e.tryGetCilium(ingress.NewPool(), hostnames.Pool(gi))
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "with poolRef guestnet creates no pool")
	e.g.Eventually(func() string { return getGuestIngress(t, e.l, gi).Status.LoadBalancerIP }).WithTimeout(giTimeout).Should(Equal("10.98.87.5"))
}

// The ClusterClass variable is no way around a policy: the GuestIngress guestnet's topology
// controller makes from a Cluster's `guestnet` variable is admitted by the same rules.
func TestSecurity_TopologyVariableFollowsThePolicy(t *testing.T) {
	e := newSecurityEnv(t, "10.98.88", withTopology())
	e.createPolicy("topology")
	value := `{"ingress": {"guestService": {"namespace": "%s", "name": "envoy"},
	  "ports": [{"name": "http", "port": 80, "nodePort": %d}, {"name": "https", "port": 443, "nodePort": %d}],
	  "loadBalancer": {"ip": "%s", "l2": {"interfaces": ["%s"]}}}}`
	cluster := &clusterv1.Cluster{}
	e.g.Expect(e.host.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: e.gc.Name}, cluster)).To(Succeed())
	setVariable := func(ip, iface string) {
		e.g.Expect(updateCluster(e.ctx, e.host, cluster, func(c *clusterv1.Cluster) {
			c.Spec.Topology = clusterv1.Topology{
				ClassRef: clusterv1.ClusterClassRef{Name: "kubevirt-guestnet"},
				Version:  "v1.33.1",
				Variables: []clusterv1.ClusterVariable{{Name: topology.VariableName,
					Value: apiextensionsv1.JSON{Raw: []byte(fmt.Sprintf(value, e.guestSvc.Namespace, e.nodePort(0), e.nodePort(1), ip, iface))}}},
			}
		})).To(Succeed())
	}
	setVariable("10.2.6.5", "^mgmt0$")
	gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: topology.ObjectName(cluster)}}
	c := e.eventuallyAdmitted(t, gi, metav1.ConditionFalse)
	got := getGuestIngress(t, e.l, gi)
	e.g.Expect(got.Labels).To(HaveKeyWithValue(topology.ManagedLabel, topology.ManagedValue), "made from the variable")
	e.g.Expect(c.Message).To(And(ContainSubstring("announcing on interface ^mgmt0$"), ContainSubstring("IP 10.2.6.5")))
	e.expectNothingOnTheHost(t, gi)

	setVariable("10.98.88.10", "^eth0$")
	e.eventuallyAdmitted(t, gi, metav1.ConditionTrue)
	e.expectNoHostNodePort(t, e.eventuallyHostService(t, gi))
}

// The bridge side: a GuestWebhookBridge's host Service is a ClusterIP Service (no nodePort,
// no external or load-balancer IP) that selects only the worker virt-launcher pods of its
// own Cluster in its own namespace. Another namespace with a Cluster of the same name, and
// pods carrying the very same labels, is never behind it: through a bridge a tenant reaches
// nothing but its own workers' bridge nodePorts.
func TestSecurity_BridgeHostServicesReachOnlyTheirOwnWorkers(t *testing.T) {
	e := newSecurityEnv(t, "10.98.89")
	g := e.g
	ctx := e.ctx
	addWorker(t, e.l, e.gc, e.ns+"-md-0-a", "10.244.89.11")
	// The other tenant: same Cluster name, same worker labels, another namespace.
	other := uniqueName("sec-other")
	g.Expect(e.host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other, Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	otherCluster := createIngressCluster(t, e.l, other, e.gc.Name)
	addWorker(t, e.l, otherCluster, other+"-md-0-a", "10.244.89.21")

	webhookNS := uniqueName("cert-manager")
	wh, err := lab.CreateServiceWebhook(ctx, e.l.Guest.Client, e.l.Guest.CA.CertPEM(), webhookNS, "target-"+webhookNS)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = e.l.Guest.Client.Delete(context.Background(), wh.Config) })
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "bridge", Labels: map[string]string{clusterv1.WatchLabel: e.filter}},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        e.gc.Name,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{wh.Config.Name}},
			NodePortRange:      guestnetv1.NodePortRange{Start: e.nodePort(8), Size: 2},
			Mode:               guestnetv1.BridgeModeAlways,
		},
	}
	g.Expect(e.tenant.Create(ctx, gwb)).To(Succeed(), "the tenant may create GuestWebhookBridges")

	name := hostnames.BridgeHostService(e.gc.Name, webhookNS, "cert-manager-webhook")
	svc := &corev1.Service{}
	g.Eventually(func() error { return e.host.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: name}, svc) }).WithTimeout(giTimeout).Should(Succeed())
	g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP))
	g.Expect(svc.Spec.Selector).To(Equal(virtlauncher.WorkerSelector(e.ns, e.gc.Name)))
	g.Expect(svc.Spec.ExternalIPs).To(BeEmpty())
	g.Expect(svc.Spec.LoadBalancerIP).To(BeEmpty())
	for _, p := range svc.Spec.Ports {
		g.Expect(p.NodePort).To(BeZero())
	}
	// The real kube-controller-manager fills its EndpointSlices: this namespace's worker only.
	g.Eventually(func(g Gomega) {
		slices := &discoveryv1.EndpointSliceList{}
		g.Expect(e.host.List(ctx, slices, client.InNamespace(e.ns), client.MatchingLabels{discoveryv1.LabelServiceName: name})).To(Succeed())
		var addresses []string
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				addresses = append(addresses, ep.Addresses...)
			}
		}
		g.Expect(addresses).To(ConsistOf("10.244.89.11"))
	}).WithTimeout(giTimeout).Should(Succeed())
	// And the other namespace has no Service of the bridge.
	list := &corev1.ServiceList{}
	g.Expect(e.host.List(ctx, list, client.InNamespace(other))).To(Succeed())
	for _, s := range list.Items {
		g.Expect(s.Labels).NotTo(HaveKey(ownership.BridgeNameLabel))
	}
}

// The host admin's template (templates/guestingresspolicy.yaml), rendered by the real
// clusterctl for a namespace and a range, is a valid policy that admits the GuestIngress and
// the GuestNodeIdentity's control plane address every cluster-template*.yaml flavor renders
// for that namespace and IPs of the range, and nothing of another namespace.
func TestSecurity_TemplatePolicyAdmitsTheFlavorsGuestIngress(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	root, err := lab.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	cc := newClusterctl(t, l)
	ns := uniqueName("flavor-policy")
	g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())

	file := filepath.Join(root, "templates", "guestingresspolicy.yaml")
	g.Expect(cc.run(nil, "generate", "yaml", "--from", file, "--list-variables")).To(ContainSubstring(
		"  - GUESTNET_POLICY_ADDRESSES\n  - GUESTNET_POLICY_INTERFACE\n  - GUESTNET_POLICY_MAX_INGRESSES\n  - GUESTNET_POLICY_NODE_ROLE\n  - GUESTNET_TENANT_NAMESPACE\n"))
	out := cc.run([]string{"GUESTNET_TENANT_NAMESPACE=" + ns, "GUESTNET_POLICY_ADDRESSES=10.98.250.0/24"}, "generate", "yaml", "--from", file)
	objs, err := lab.DecodeObjects([]byte(out))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(objs).To(HaveLen(1))
	g.Expect(l.Host.Client.Create(ctx, objs[0].DeepCopy(), client.DryRunAll, client.FieldValidation("Strict"))).To(Succeed())
	policy := guestnetv1.GuestIngressPolicy{}
	g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, &policy)).To(Succeed())

	namespace := &corev1.Namespace{}
	g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Name: ns}, namespace)).To(Succeed())
	flavors, err := filepath.Glob(filepath.Join(root, "templates", "cluster-template*.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	for _, flavor := range flavors {
		rendered, _ := renderFlavor(t, cc, flavor, ns) // GUESTNET_INGRESS_IP=10.98.250.10, GUESTNET_CONTROL_PLANE_IP=10.98.250.11
		var found, foundControlPlane bool
		for _, o := range rendered {
			if o.GetKind() == "GuestNodeIdentity" {
				foundControlPlane = true
				gni := &guestnetv1.GuestNodeIdentity{}
				g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, gni)).To(Succeed())
				g.Expect(gni.Spec.ControlPlane).NotTo(BeNil(), "%s: the control plane address", filepath.Base(flavor))
				d := admission.AdmitControlPlane(admission.Input{Namespace: namespace, Policies: []guestnetv1.GuestIngressPolicy{policy}}, gni)
				g.Expect(d.Admitted).To(BeTrue(), "%s: %s", filepath.Base(flavor), d.Message)
				g.Expect(d.Announcement.Interfaces).To(Equal([]string{"^eth0$"}))
				other := namespace.DeepCopy()
				other.Name, other.Labels = "someone-else", map[string]string{corev1.LabelMetadataName: "someone-else"}
				gni.Namespace = other.Name
				g.Expect(admission.AdmitControlPlane(admission.Input{Namespace: other, Policies: []guestnetv1.GuestIngressPolicy{policy}}, gni).Reason).
					To(Equal(guestnetv1.NoPolicyReason))
			}
			if o.GetKind() != "GuestIngress" {
				continue
			}
			found = true
			gi := &guestnetv1.GuestIngress{}
			g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, gi)).To(Succeed())
			d := admission.Admit(admission.Input{GuestIngress: gi, Namespace: namespace, Policies: []guestnetv1.GuestIngressPolicy{policy}})
			g.Expect(d.Admitted).To(BeTrue(), "%s: %s", filepath.Base(flavor), d.Message)
			g.Expect(d.Announcement.Interfaces).To(Equal([]string{"^eth0$"}))

			other := namespace.DeepCopy()
			other.Name, other.Labels = "someone-else", map[string]string{corev1.LabelMetadataName: "someone-else"}
			gi.Namespace = other.Name
			g.Expect(admission.Admit(admission.Input{GuestIngress: gi, Namespace: other, Policies: []guestnetv1.GuestIngressPolicy{policy}}).Reason).
				To(Equal(guestnetv1.NoPolicyReason))
		}
		g.Expect(found).To(BeTrue(), "%s renders a GuestIngress", filepath.Base(flavor))
		g.Expect(foundControlPlane).To(BeTrue(), "%s renders a GuestNodeIdentity", filepath.Base(flavor))
	}
}

// --- the environment ---------------------------------------------------------------------

type securityEnv struct {
	t      *testing.T
	g      Gomega
	l      *lab.Lab
	ctx    context.Context
	ns     string
	filter string
	// host acts as the host admin; tenant as a user holding the namespace's admin role.
	host, tenant client.Client
	gc           *lab.GuestCluster
	guestSvc     *corev1.Service
	lbNet        string
	// nodePortBase is the first of the test's 10 guest nodePorts (the guest is shared).
	nodePortBase int32
	// ownGuestServices are the guest Services ownGuestIngress made.
	ownGuestServices []*corev1.Service
}

func (e *securityEnv) nodePort(i int32) int32 { return e.nodePortBase + i }

type securityOption func(*securityOptions)

type securityOptions struct{ topology bool }

// withTopology runs the manager with the experimental topology controller.
func withTopology() securityOption { return func(o *securityOptions) { o.topology = true } }

// newSecurityEnv makes a namespace that no policy selects (opted out of the lab's), a
// Cluster "tenant-a" in it with a reachable guest and the guest's Envoy Service, the tenant
// identity, and starts guestnet's manager as a ServiceAccount with the generated RBAC,
// limited by a watch filter (not a namespace: a manager that sees every namespace also
// runs the GuestIngressPolicy controller). lbNet is the test's /24 ("10.98.<n>", n from 80
// to 89), which also gives it guest nodePorts 32000+10*(n-80) and the nine after.
func newSecurityEnv(t *testing.T, lbNet string, opts ...securityOption) *securityEnv {
	var o securityOptions
	for _, opt := range opts {
		opt(&o)
	}
	l := startLab(t)
	e := &securityEnv{t: t, g: NewWithT(t), l: l, ctx: testContext(t), ns: uniqueName("sec"), host: l.Host.Client, lbNet: lbNet}
	e.filter = e.ns
	var octet int32
	_, err := fmt.Sscanf(lbNet, "10.98.%d", &octet)
	e.g.Expect(err).NotTo(HaveOccurred())
	e.nodePortBase = 32000 + 10*(octet-80)
	e.g.Expect(e.host.Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns, Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	e.tenant = tenantClient(t, l, e.ns)

	flags := lab.ManagerFlags{WatchFilter: e.filter}
	if o.topology {
		flags.FeatureGates = string(feature.ClusterTopologyVariables) + "=true"
	}
	m := runManagerAsServiceAccount(t, l, e.ns, flags)
	t.Cleanup(func() {
		for _, line := range strings.Split(m.Log(), "\n") {
			if strings.Contains(line, "forbidden") {
				t.Errorf("the manager was refused a request: the generated RBAC lacks a rule: %s", line)
			}
		}
	})

	startCiliumStandIn(t, l)
	e.gc = createIngressCluster(t, l, e.ns, "tenant-a", e.nodePort(0), e.nodePort(1))
	labelForFilter(t, l, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: e.gc.Name}}, e.filter)
	e.guestSvc = createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	return e
}

// createPolicy creates a policy selecting the test's namespace: its /24, Cilium's L2
// announcer on ^eth0$ of every node, annotations example.com/*, Cluster traffic.
func (e *securityEnv) createPolicy(name string, mutate ...func(*guestnetv1.GuestIngressPolicy)) *guestnetv1.GuestIngressPolicy {
	p := &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + e.ns, Labels: map[string]string{clusterv1.WatchLabel: e.filter}},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: e.ns}},
			Addresses:         []string{e.lbNet + ".0/24"},
			L2Announcement:    &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$"}},
			HostService:       guestnetv1.HostServicePolicy{AllowedAnnotationKeys: []string{"example.com/*"}},
		},
	}
	for _, m := range mutate {
		m(p)
	}
	e.g.Expect(e.host.Create(e.ctx, p)).To(Succeed())
	e.t.Cleanup(func() { _ = e.host.Delete(context.Background(), p) })
	return p
}

func poolObject(name string, selector map[string]any, blocks ...string) *unstructured.Unstructured {
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

// createPool creates a pool of the host admin's (not guestnet's).
func (e *securityEnv) createPool(name string, selector map[string]any, blocks ...string) {
	p := poolObject(name, selector, blocks...)
	e.g.Expect(e.host.Create(e.ctx, p)).To(Succeed())
	e.t.Cleanup(func() { _ = e.host.Delete(context.Background(), p) })
}

// newGuestIngress is a GuestIngress of the Cluster "tenant-a", with the watch filter label,
// for the guest's Envoy Service, IP ip, fixed nodePorts and announced on ^eth0$.
func (e *securityEnv) newGuestIngress(name, ip string) *guestnetv1.GuestIngress {
	gi := newGuestIngress(e.ns, name, e.gc.Name, e.guestSvc, ip, ptr.To(e.nodePort(0)), ptr.To(e.nodePort(1)))
	gi.Labels = map[string]string{clusterv1.WatchLabel: e.filter}
	return gi
}

func (e *securityEnv) admitted(gi *guestnetv1.GuestIngress) metav1.Condition {
	got := &guestnetv1.GuestIngress{}
	if err := e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), got); err != nil {
		return metav1.Condition{}
	}
	if c := conditions.Get(got, guestnetv1.AdmittedCondition); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// eventuallyAdmitted waits for the GuestIngress's Admitted condition to have status.
func (e *securityEnv) eventuallyAdmitted(t *testing.T, gi *guestnetv1.GuestIngress, status metav1.ConditionStatus) metav1.Condition {
	t.Helper()
	var c metav1.Condition
	NewWithT(t).Eventually(func() metav1.ConditionStatus {
		c = e.admitted(gi)
		return c.Status
	}).WithTimeout(giTimeout).WithPolling(100*time.Millisecond).Should(Equal(status), "Admitted of %s: %s", gi.Name, c.Message)
	return c
}

// expectNothingOnTheHost: no host Service, pool or L2 announcement policy exists for gi (read
// from the API server, with the admin's identity).
func (e *securityEnv) expectNothingOnTheHost(t *testing.T, gi *guestnetv1.GuestIngress) {
	t.Helper()
	g := NewWithT(t)
	got := getGuestIngress(t, e.l, gi)
	// The status patch of a refusal may lag the refusal by one reconcile (the patch is
	// computed against the cached object).
	g.Eventually(func() []string {
		got = getGuestIngress(t, e.l, gi)
		return []string{got.Status.LoadBalancerIP, got.Status.HostService}
	}).WithTimeout(giTimeout).Should(Equal([]string{"", ""}))
	err := e.host.Get(e.ctx, client.ObjectKey{Namespace: gi.Namespace, Name: hostnames.HostService(got)}, &corev1.Service{})
	g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "host Service of %s: %v", gi.Name, err)
	for _, obj := range []*unstructured.Unstructured{ingress.NewPool(), ingress.NewL2Policy()} {
		err := e.tryGetCilium(obj, hostnames.Pool(got))
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s of %s: %v", obj.GetKind(), gi.Name, err)
	}
	services := &corev1.ServiceList{}
	g.Expect(e.host.List(e.ctx, services, client.InNamespace(gi.Namespace), client.MatchingLabels(ownership.SelectGuestIngress(got)))).To(Succeed())
	g.Expect(services.Items).To(BeEmpty())
}

func (e *securityEnv) tryGetCilium(obj *unstructured.Unstructured, name string) error {
	return e.host.Get(e.ctx, client.ObjectKey{Name: name}, obj)
}

func (e *securityEnv) getCilium(t *testing.T, obj *unstructured.Unstructured, name string) *unstructured.Unstructured {
	t.Helper()
	NewWithT(t).Eventually(func() error { err := e.tryGetCilium(obj, name); return err }).WithTimeout(giTimeout).Should(Succeed())
	return obj
}

func (e *securityEnv) eventuallyHostService(t *testing.T, gi *guestnetv1.GuestIngress) *corev1.Service {
	t.Helper()
	svc := &corev1.Service{}
	name := hostnames.HostService(getGuestIngress(t, e.l, gi))
	NewWithT(t).Eventually(func() error {
		return e.host.Get(e.ctx, client.ObjectKey{Namespace: gi.Namespace, Name: name}, svc)
	}).WithTimeout(giTimeout).Should(Succeed())
	return svc
}

// expectNoHostNodePort: the live host Service opens no port on the host nodes.
func (e *securityEnv) expectNoHostNodePort(t *testing.T, svc *corev1.Service) {
	t.Helper()
	g := NewWithT(t)
	g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeLoadBalancer))
	g.Expect(svc.Spec.AllocateLoadBalancerNodePorts).To(Equal(ptr.To(false)))
	for _, p := range svc.Spec.Ports {
		g.Expect(p.NodePort).To(BeZero(), "port %s", p.Name)
	}
	g.Expect(svc.Spec.HealthCheckNodePort).To(BeZero())
	g.Expect(svc.Spec.ExternalIPs).To(BeEmpty())
}

// --- identities --------------------------------------------------------------------------

// tenantClient is a client acting as the user tenant@<ns> (impersonated by the lab's admin),
// bound to Kubernetes' own `admin` ClusterRole in namespace ns only: what a hosting provider
// gives a tenant. guestnet's tenant roles (config/rbac/tenant_roles.yaml) are installed, and
// the kube-controller-manager aggregates them into `admin`.
func tenantClient(t *testing.T, l *lab.Lab, ns string) client.Client {
	t.Helper()
	g := NewWithT(t)
	ctx := testContext(t)
	installTenantRoles(t, l)
	user := "tenant@" + ns
	g.Expect(l.Host.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	})).To(Succeed())
	cfg := rest.CopyConfig(l.Host.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: lab.Scheme})
	g.Expect(err).NotTo(HaveOccurred())
	return c
}

// installTenantRoles creates the ClusterRoles of config/rbac/tenant_roles.yaml with the
// names the components file gives them (guestnet-<name>), once per lab, and waits until
// `admin`, `edit` and `view` carry them.
func installTenantRoles(t *testing.T, l *lab.Lab) {
	t.Helper()
	g := NewWithT(t)
	ctx := testContext(t)
	root, err := lab.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	data, err := os.ReadFile(filepath.Join(root, "config", "rbac", "tenant_roles.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	objs, err := lab.DecodeObjects(data)
	g.Expect(err).NotTo(HaveOccurred())
	for _, o := range objs {
		role := &rbacv1.ClusterRole{}
		g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, role)).To(Succeed())
		role.Name = "guestnet-" + role.Name
		if err := l.Host.Client.Create(ctx, role); !apierrors.IsAlreadyExists(err) {
			g.Expect(err).NotTo(HaveOccurred())
		}
	}
	for role, verb := range map[string]string{"admin": "create", "edit": "create", "view": "list"} {
		g.Eventually(func() bool {
			cr := &rbacv1.ClusterRole{}
			if l.Host.Client.Get(ctx, client.ObjectKey{Name: role}, cr) != nil {
				return false
			}
			return slices.ContainsFunc(cr.Rules, func(r rbacv1.PolicyRule) bool {
				return slices.Contains(r.APIGroups, guestnetv1.GroupVersion.Group) && slices.Contains(r.Resources, "guestingresses") && slices.Contains(r.Verbs, verb)
			})
		}).WithTimeout(giTimeout).Should(BeTrue(), "the kube-controller-manager aggregates guestnet's tenant roles into %s", role)
	}
}

// runManagerAsServiceAccount runs guestnet's manager until the test ends, as a ServiceAccount
// of namespace ns bound to exactly the generated ClusterRole (config/rbac/role.yaml) and the
// leader election Role, as deployed. It returns the manager's log; when the test fails, the
// log lines of refused requests are printed.
func runManagerAsServiceAccount(t *testing.T, l *lab.Lab, ns string, flags lab.ManagerFlags) *lab.ManagerBinary {
	t.Helper()
	g := NewWithT(t)
	ctx := testContext(t)
	host := l.Host.Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guestnet-manager"}}
	g.Expect(host.Create(ctx, sa)).To(Succeed())
	root, err := lab.RepoRoot()
	g.Expect(err).NotTo(HaveOccurred())
	clusterRole := &rbacv1.ClusterRole{}
	readYAML(g, filepath.Join(root, "config", "rbac", "role.yaml"), clusterRole)
	clusterRole.Name = ns + "-manager"
	g.Expect(host.Create(ctx, clusterRole)).To(Succeed())
	t.Cleanup(func() { _ = host.Delete(context.Background(), clusterRole) })
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa.Name}},
	}
	g.Expect(host.Create(ctx, binding)).To(Succeed())
	t.Cleanup(func() { _ = host.Delete(context.Background(), binding) })
	electionRole := &rbacv1.Role{}
	readYAML(g, filepath.Join(root, "config", "rbac", "leader_election_role.yaml"), electionRole)
	electionRole.Namespace = ns
	g.Expect(host.Create(ctx, electionRole)).To(Succeed())

	// A token from the TokenRequest API; the manager logs to a buffer the test reads.
	clientset, err := kubernetes.NewForConfig(l.Host.Config)
	g.Expect(err).NotTo(HaveOccurred())
	token, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	flags.As = rest.AnonymousClientConfig(l.Host.Config)
	flags.As.BearerToken = token.Status.Token
	m := l.StartManagerBinary(t, flags)
	t.Cleanup(func() {
		if t.Failed() {
			for _, line := range strings.Split(m.Log(), "\n") {
				if strings.Contains(line, "forbidden") {
					t.Logf("manager: %s", line)
				}
			}
		}
	})
	return m
}

// update reads obj afresh into a new object, mutates it and updates it, again on conflicts.
func update[T client.Object](ctx context.Context, c client.Client, obj T, empty func() T, mutate func(T)) error {
	for {
		got := empty()
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
			return err
		}
		mutate(got)
		if err := c.Update(ctx, got); !apierrors.IsConflict(err) {
			return err
		}
	}
}

func updatePolicy(ctx context.Context, c client.Client, p *guestnetv1.GuestIngressPolicy, mutate func(*guestnetv1.GuestIngressPolicy)) error {
	return update(ctx, c, p, func() *guestnetv1.GuestIngressPolicy { return &guestnetv1.GuestIngressPolicy{} }, mutate)
}

func updateCluster(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, mutate func(*clusterv1.Cluster)) error {
	return update(ctx, c, cluster, func() *clusterv1.Cluster { return &clusterv1.Cluster{} }, mutate)
}
