package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
)

// capkMachineNamespaceLabel is the label the real CAPK (v0.11.2, pkg/kubevirt/machine.go,
// Machine.Create) sets on a VM and its VMI template to the namespace of the KubevirtMachine,
// whatever the template says; KubeVirt copies the VMI's labels to the virt-launcher pod.
const capkMachineNamespaceLabel = "capk.cluster.x-k8s.io/kubevirt-machine-namespace"

// Workers are the Cluster's own. Another tenant names its Cluster like the victim's and
// has the real CAPK put its VMs into the victim's namespace (virtualMachineTemplate
// .metadata.namespace, which CAPK honours: nothing but the optional admission policy
// guestnet-kubevirt-namespaces forbids it, and these tests run without it). Its
// virt-launcher pods carry the victim Cluster's name, role and KubeVirt's label, and even a
// VMI label claiming the victim's namespace, which CAPK overrides with the attacker's own.
// They are never endpoints of the victim's GuestIngress host Service nor of its
// GuestWebhookBridge host Service, and no request through either reaches them.
func TestSecurity_AnotherNamespacesVMsAreNotTheClustersWorkers(t *testing.T) {
	e := newSecurityEnv(t, "10.98.112")
	g, ctx, host := e.g, e.ctx, e.host
	e.createPolicy("workers")

	// The victim: Cluster "shop" whose workers declare the GuestIngress's nodePort and the
	// bridge's range, one worker answering with its name on both.
	victim := createIngressCluster(t, e.l, e.ns, "shop", e.nodePort(0), e.nodePort(1), e.nodePort(8), e.nodePort(9))
	labelForFilter(t, e.l, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: victim.Name}}, e.filter)
	own := addWorker(t, e.l, victim, e.ns+"-shop-w0", "10.244.112.11")
	for _, p := range []int32{e.nodePort(0), e.nodePort(8)} {
		g.Expect(own.ServeMachineName(p)).To(Succeed())
	}
	gi := e.newGuestIngress("web", e.lbNet+".10")
	gi.Spec.ClusterName = victim.Name
	g.Expect(e.tenant.Create(ctx, gi)).To(Succeed())
	webhookNS := uniqueName("cert-manager")
	wh, err := lab.CreateServiceWebhook(ctx, e.l.Guest.Client, e.l.Guest.CA.CertPEM(), webhookNS, "target-"+webhookNS)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = e.l.Guest.Client.Delete(ctx, wh.Config) })
	gwb := &guestnetv1.GuestWebhookBridge{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "bridge", Labels: map[string]string{clusterv1.WatchLabel: e.filter}},
		Spec: guestnetv1.GuestWebhookBridgeSpec{
			ClusterName:        victim.Name,
			ValidatingWebhooks: &guestnetv1.TargetSelector{Names: []string{wh.Config.Name}},
			NodePortRange:      guestnetv1.NodePortRange{Start: e.nodePort(8), Size: 2},
			Mode:               guestnetv1.BridgeModeAlways,
		},
	}
	g.Expect(e.tenant.Create(ctx, gwb)).To(Succeed())
	ingressService := e.eventuallyHostService(t, gi).Name
	bridgeService := hostnames.BridgeHostService(victim.Name, webhookNS, "cert-manager-webhook")
	g.Eventually(func(g Gomega) {
		got := &guestnetv1.GuestIngress{}
		g.Expect(host.Get(ctx, client.ObjectKeyFromObject(gi), got)).To(Succeed())
		g.Expect(conditions.IsTrue(got, guestnetv1.ReadyCondition)).To(BeTrue(), "%v", got.Status.Conditions)
		g.Expect(host.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: bridgeService}, &corev1.Service{})).To(Succeed())
	}).WithTimeout(giTimeout).Should(Succeed())

	// The attacker: a tenant of its own namespace, with the real CAPI and CAPK, and KubeVirt
	// (the stand-in) running the VMs CAPK creates in the victim's namespace.
	attackerNS := uniqueName("sec-attacker")
	g.Expect(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: attackerNS, Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	attacker := tenantClient(t, e.l, attackerNS)
	allowClusterWrites(t, e.l, attackerNS, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "tenant@" + attackerNS})
	capi, err := e.l.StartCAPI(ctx, attackerNS, attackerNS)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capi.Stop)
	capk, err := e.l.StartCAPK(ctx, attackerNS)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capk.Stop)
	kv, err := e.l.StartKubeVirtStandIn(ctx, e.ns, lab.KubeVirtOptions{
		WorkerSubnet: "10.244.113.0/24",
		OnBoot: func(_ context.Context, w *lab.Worker) error {
			for _, p := range []int32{e.nodePort(0), e.nodePort(8)} {
				if err := w.ServeMachineName(p); err != nil {
					return err
				}
			}
			return nil
		},
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kv.Stop)
	_, err = e.l.CreateGuestCluster(ctx, attackerNS, victim.Name, lab.WorkerTemplateOptions{
		Ports:       []int32{22, 10250, e.nodePort(0), e.nodePort(8)},
		VMNamespace: e.ns,
		VMILabels:   map[string]string{capkMachineNamespaceLabel: e.ns},
		As:          attacker,
	}, lab.ForRealCAPI(attackerNS), lab.ForRealCAPK())
	g.Expect(err).NotTo(HaveOccurred())

	// CAPK creates the attacker's VMs in the victim's namespace; their virt-launcher pods
	// carry everything the victim's workers carry, but the namespace of their
	// KubevirtMachines, which CAPK sets itself.
	var intruders []string
	g.Eventually(func(g Gomega) {
		pods := &corev1.PodList{}
		g.Expect(host.List(ctx, pods, client.InNamespace(e.ns), client.MatchingLabels{clusterv1.ClusterNameLabel: victim.Name})).To(Succeed())
		intruders = nil
		for _, p := range pods.Items {
			if p.Labels[capkMachineNamespaceLabel] != attackerNS {
				continue
			}
			g.Expect(p.Labels).To(HaveKeyWithValue("cluster.x-k8s.io/role", "worker"))
			g.Expect(p.Labels).To(HaveKeyWithValue("kubevirt.io", "virt-launcher"))
			g.Expect(p.Status.PodIP).NotTo(BeEmpty())
			intruders = append(intruders, p.Status.PodIP)
		}
		g.Expect(intruders).To(HaveLen(2))
		g.Expect(kv.Workers()).To(HaveLen(2))
	}).WithTimeout(4 * time.Minute).WithPolling(time.Second).Should(Succeed())
	// (The template's VMI label claiming the victim's namespace did not survive CAPK.)

	// A witness Service that selects the intruders shows that the real
	// kube-controller-manager has seen them ready.
	witness := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "witness"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{clusterv1.ClusterNameLabel: victim.Name, capkMachineNamespaceLabel: attackerNS},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(e.nodePort(0))}},
		},
	}
	g.Expect(host.Create(ctx, witness)).To(Succeed())
	g.Eventually(func() []string { return readyAddresses(g, e, witness.Name) }).WithTimeout(giTimeout).Should(ConsistOf(intruders))

	// Only the victim's own worker is behind its host Services, ...
	for _, svc := range []string{ingressService, bridgeService} {
		g.Eventually(func() []string { return readyAddresses(g, e, svc) }).WithTimeout(giTimeout).Should(ConsistOf(own.IP), "Service %s", svc)
		g.Consistently(func() []string { return readyAddresses(g, e, svc) }).WithTimeout(3*time.Second).Should(ConsistOf(own.IP), "Service %s", svc)
	}
	// ... and every request through them is answered by it, none by an intruder.
	bridge := &corev1.Service{}
	g.Expect(host.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: bridgeService}, bridge)).To(Succeed())
	for _, target := range []struct {
		host string
		port int32
	}{{e.lbNet + ".10", 80}, {bridge.Spec.ClusterIP, bridge.Spec.Ports[0].Port}} {
		var answers []string
		for range 20 {
			body, err := lab.Get(ctx, target.host, target.port)
			g.Expect(err).NotTo(HaveOccurred(), "%s:%d", target.host, target.port)
			answers = append(answers, body)
		}
		g.Expect(slices.Compact(answers)).To(Equal([]string{own.Machine}), "answers through %s:%d", target.host, target.port)
	}
}

// readyAddresses are the ready endpoint addresses of the host Service name of e's namespace,
// from its EndpointSlices (filled by the real kube-controller-manager).
func readyAddresses(g Gomega, e *securityEnv, name string) []string {
	list := &discoveryv1.EndpointSliceList{}
	g.Expect(e.host.List(e.ctx, list, client.InNamespace(e.ns), client.MatchingLabels{discoveryv1.LabelServiceName: name})).To(Succeed())
	var out []string
	for _, s := range list.Items {
		for _, ep := range s.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				out = append(out, ep.Addresses...)
			}
		}
	}
	return out
}
