package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// Issue 19, property 3: the VMs reach their control plane at an address that works from
// inside a VM, admitted and announced the GuestIngress way. The Cluster's control plane is
// k0smotron's (the stand-in) with a LoadBalancer Service kmc-<name>-lb; the real LB-IPAM gives
// it an address only from a pool that selects it. Without a GuestNodeIdentity, and with one
// whose address no policy admits, the Service gets nothing and the Cluster has no endpoint
// (the control). Once a policy admits the address, the Service gets it, k0smotron makes it the
// Cluster's endpoint and kubeconfig, guestnet reaches the guest through it, and the node agent
// in a VM on the kernel datapath (which talks to the apiserver at the Cluster's endpoint)
// becomes ready: the VM reaches its control plane at the admitted address with real packets.
// Narrowing the policy takes the address back.
func TestNodeIdentity_ControlPlaneGetsAnAdmittedAddress(t *testing.T) {
	g := NewWithT(t)
	ns := uniqueName("cpaddr")
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	g.Expect(l.Host.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{lab.NoLabPolicyLabel: "true"}}})).To(Succeed())
	ip := lab.GuestControlPlaneLoadBalancerIP
	policy := &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "a-" + ns},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector:   metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			Addresses:           []string{"10.2.6.0/24"}, // not the control plane's address, yet
			LoadBalancerClasses: []string{guestnetv1.DefaultLoadBalancerClass},
			L2Announcement:      &guestnetv1.L2AnnouncementPolicy{Interfaces: []string{"^eth0$"}},
			HostService:         guestnetv1.HostServicePolicy{ExternalTrafficPolicies: []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster}},
		},
	}
	g.Expect(l.Host.Client.Create(ctx, policy)).To(Succeed())
	t.Cleanup(func() { _ = l.Host.Client.Delete(context.Background(), policy) })

	// The real LB-IPAM, the L2 announcement and kube-proxy played (the Cilium stand-in), the
	// real CAPI (it copies the control plane's endpoint into the Cluster and marks it
	// provisioned) and k0smotron played.
	startCiliumStandIn(t, l)
	capi, err := l.StartCAPI(ctx, ns, ns)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capi.Stop)
	k0s, err := l.StartK0smotronStandIn(ctx, ns)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(k0s.Stop)
	e := newNodeIdentityEnvIn(t, l, ns, "10.244.108.0/24", lab.KubeletExternal,
		lab.ForRealCAPI(ns), lab.ForRealCAPK(), lab.WithControlPlaneLoadBalancer())
	service := client.ObjectKey{Namespace: ns, Name: lab.ControlPlaneServiceName(e.gc.Name)}
	cluster := client.ObjectKey{Namespace: ns, Name: e.gc.Name}

	// The control: k0smotron's Service exists and gets no address.
	g.Eventually(func() error { return l.Host.Client.Get(e.ctx, service, &corev1.Service{}) }).WithTimeout(nodeIdentityTimeout).Should(Succeed())
	expectNoControlPlaneAddress := func(g Gomega) {
		svc := &corev1.Service{}
		g.Expect(l.Host.Client.Get(e.ctx, service, svc)).To(Succeed())
		g.Expect(ingress.LoadBalancerIP(svc)).To(BeEmpty(), "no pool selects the control plane's Service")
		c := &clusterv1.Cluster{}
		g.Expect(l.Host.Client.Get(e.ctx, cluster, c)).To(Succeed())
		g.Expect(c.Spec.ControlPlaneEndpoint.Host).To(BeEmpty())
	}
	g.Consistently(expectNoControlPlaneAddress).WithTimeout(3 * time.Second).Should(Succeed())

	// Asked for, not admitted: nothing on the host.
	gni := &guestnetv1.GuestNodeIdentity{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guest"},
		Spec: guestnetv1.GuestNodeIdentitySpec{ClusterName: e.gc.Name, ControlPlane: &guestnetv1.ControlPlaneAddressSpec{
			IP: ip, L2: &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^eth0$"}}}},
	}
	g.Expect(l.Host.Client.Create(e.ctx, gni)).To(Succeed())
	g.Eventually(func(g Gomega) {
		c := e.condition(g, gni, guestnetv1.ControlPlaneAddressCondition)
		g.Expect(c.Reason).To(Equal(guestnetv1.NotAllowedReason), c.Message)
		g.Expect(c.Message).To(ContainSubstring("IP " + ip))
		g.Expect(c.Message).To(ContainSubstring("spec.controlPlane"))
	}).WithTimeout(nodeIdentityTimeout).Should(Succeed())
	expectNoControlPlaneAddress(g)
	pool, l2 := ingress.NewPool(), ingress.NewL2Policy()
	poolName := fmt.Sprintf("%s.%s.control-plane", ns, e.gc.Name)
	for _, o := range []client.Object{pool, l2} {
		g.Expect(apierrors.IsNotFound(l.Host.Client.Get(e.ctx, client.ObjectKey{Name: poolName}, o))).To(BeTrue(), "nothing on the host")
	}

	// The admin admits it: the Service gets the address, k0smotron makes it the endpoint.
	g.Expect(l.Host.Client.Get(e.ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
	policy.Spec.Addresses = append(policy.Spec.Addresses, ip+"/32")
	g.Expect(l.Host.Client.Update(e.ctx, policy)).To(Succeed())
	start := time.Now()
	g.Eventually(func(g Gomega) {
		c := &clusterv1.Cluster{}
		g.Expect(l.Host.Client.Get(e.ctx, cluster, c)).To(Succeed())
		g.Expect(c.Spec.ControlPlaneEndpoint).To(Equal(clusterv1.APIEndpoint{Host: ip, Port: lab.APIServerPort}))
		cond := e.condition(g, gni, guestnetv1.ControlPlaneAddressCondition)
		g.Expect(cond.Status).To(Equal(metav1.ConditionTrue), "%s: %s", cond.Reason, cond.Message)
	}).WithTimeout(nodeIdentityTimeout).Should(Succeed())
	t.Logf("the control plane's Service got %s and it is the Cluster's endpoint %s after the policy admitted it", ip, time.Since(start).Round(10*time.Millisecond))
	svc := &corev1.Service{}
	g.Expect(l.Host.Client.Get(e.ctx, service, svc)).To(Succeed())
	g.Expect(svc.Annotations).To(HaveKeyWithValue(ingress.LBIPAMIPsAnnotation, ip))

	// A VM reaches its control plane there: with the Cluster's kubeconfig, from inside the VM
	// (the same path the node agent takes), and the agent becomes ready through it.
	e.createVM(t, ns+"-a")
	a := e.worker(t, ns+"-a")
	cfg := clusterKubeconfig(g, l, cluster)
	g.Expect(cfg.Host).To(Equal("https://" + net.JoinHostPort(ip, fmt.Sprint(lab.APIServerPort))))
	g.Eventually(func(g Gomega) { readyz(e.ctx, g, cfg, a.DialFromVM) }).WithTimeout(nodeIdentityTimeout).Should(Succeed(),
		"the guest apiserver at the control plane's address, from inside a VM on the kernel datapath")
	g.Eventually(func(g Gomega) {
		c := e.condition(g, gni, guestnetv1.ReadyCondition)
		g.Expect(c.Status).To(Equal(metav1.ConditionTrue), "Ready: %s %s", c.Reason, c.Message)
		got := &guestnetv1.GuestNodeIdentity{}
		g.Expect(l.Host.Client.Get(e.ctx, client.ObjectKeyFromObject(gni), got)).To(Succeed())
		g.Expect(got.Status.ControlPlaneAddress).To(Equal(ip))
		g.Expect(got.Status.AgentsReady).To(BeNumerically("==", 1), "the agent in the VM reaches the apiserver at the control plane address")
	}).WithTimeout(guestConnectTimeout).Should(Succeed())

	// Held within admitted: the admin narrows the policy, the address goes.
	g.Expect(l.Host.Client.Get(e.ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
	policy.Spec.Addresses = []string{"10.2.6.0/24"}
	g.Expect(l.Host.Client.Update(e.ctx, policy)).To(Succeed())
	g.Eventually(func(g Gomega) {
		for _, o := range []client.Object{ingress.NewPool(), ingress.NewL2Policy()} {
			g.Expect(apierrors.IsNotFound(l.Host.Client.Get(e.ctx, client.ObjectKey{Name: poolName}, o))).To(BeTrue(), "%T withdrawn", o)
		}
		svc := &corev1.Service{}
		g.Expect(l.Host.Client.Get(e.ctx, service, svc)).To(Succeed())
		g.Expect(svc.Annotations).NotTo(HaveKey(ingress.LBIPAMIPsAnnotation))
		g.Expect(ingress.LoadBalancerIP(svc)).To(BeEmpty(), "LB-IPAM takes the address back with its pool")
		c := e.condition(g, gni, guestnetv1.ControlPlaneAddressCondition)
		g.Expect(c.Reason).To(Equal(guestnetv1.NotAllowedReason))
	}).WithTimeout(nodeIdentityTimeout).Should(Succeed())

	// The GuestNodeIdentity can still be deleted: the guest is unreachable now, so give up on it.
	patch := client.MergeFrom(gni.DeepCopy())
	gni.Annotations = map[string]string{guestnetv1.SkipGuestCleanupAnnotation: "true"}
	g.Expect(l.Host.Client.Patch(e.ctx, gni, patch)).To(Succeed())
	g.Expect(l.Host.Client.Delete(e.ctx, gni)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(l.Host.Client.Get(e.ctx, client.ObjectKeyFromObject(gni), &guestnetv1.GuestNodeIdentity{}))
	}).WithTimeout(nodeIdentityTimeout).Should(BeTrue())
}

// guestConnectTimeout bounds a wait for guestnet's first connection to a guest whose
// kubeconfig k0smotron writes only once the control plane has its address: CAPI's
// ClusterCache retries a failed connection after 30 s.
const guestConnectTimeout = 2 * time.Minute

// clusterKubeconfig is the client configuration of the Cluster's <cluster>-kubeconfig Secret,
// which k0smotron wrote.
func clusterKubeconfig(g Gomega, l *lab.Lab, cluster client.ObjectKey) *rest.Config {
	secret := &corev1.Secret{}
	g.Expect(l.Host.Client.Get(context.Background(), client.ObjectKey{Namespace: cluster.Namespace, Name: cluster.Name + "-kubeconfig"}, secret)).To(Succeed())
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["value"])
	g.Expect(err).NotTo(HaveOccurred())
	return cfg
}
