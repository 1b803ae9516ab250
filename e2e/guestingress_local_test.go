package e2e

import (
	"context"
	"net"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/hostnames"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// Client source IPs through a GuestIngress (docs/client-source-ip.md), dual-stack, with real
// packets on the lab's kernel datapath: a GuestIngress of Cilium's BGP class with
// externalTrafficPolicy Local and two fixed IPs, one per family, that the real LB-IPAM gives
// its host Service. guestnet gives the Service no selector and writes its EndpointSlices for
// the one worker whose guest node runs the ingress pod; a client outside sees its own address
// at the guest's ingress pod over IPv4 and IPv6 (the kernel load balancer playing Cilium's,
// KubeVirt's masquerade, the real kube-proxy in the VM). The guest Service turned Cluster is
// reported (GuestServiceTrafficPolicy) and loses the address; the ingress pod moved to the
// other worker takes the endpoints with it.
func TestGuestIngress_ClientSourceIPWithLocalTraffic(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	c := l.Host.Client
	ns := uniqueName("local")
	policy := &guestnetv1.GuestIngressPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "local-" + ns},
		Spec: guestnetv1.GuestIngressPolicySpec{
			NamespaceSelector:   metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
			Addresses:           []string{"10.98.164.0/24", "fd00:10:98::164:0/120"},
			LoadBalancerClasses: []string{ingress.CiliumBGPClass},
			BGPAdvertisement:    &guestnetv1.BGPAdvertisementPolicy{AdvertisementLabels: map[string]string{"bgp.example.com/advertise": ns}},
			HostService:         guestnetv1.HostServicePolicy{ExternalTrafficPolicies: []corev1.ServiceExternalTrafficPolicy{"Cluster", "Local"}},
		},
	}
	createOwnPolicy(t, l, ns, policy)
	startCiliumStandIn(t, l)

	const nodePort = 31491
	gc := createIngressCluster(t, l, ns, "tenant-a", nodePort)
	a := addWorker(t, l, gc, ns+"-md-0-a", "10.244.64.1", lab.DualStack(), lab.OnHostNode("host-node-1"))
	b := addWorker(t, l, gc, ns+"-md-0-b", "10.244.64.2", lab.DualStack(), lab.OnHostNode("host-node-2"))
	for _, w := range []*lab.Worker{a, b} {
		kp, err := l.StartGuestKubeProxy(ctx, w, lab.GuestKubeProxyOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(kp.Stop)
	}
	guestNS := uniqueName("projectcontour")
	g.Expect(l.Guest.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: guestNS}})).To(Succeed())
	t.Cleanup(func() { // the guest is every test's: its nodePort goes with the Service
		_ = l.Guest.Client.Delete(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: guestNS, Name: "envoy"}})
	})
	guestSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: guestNS, Name: "envoy"},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeNodePort,
			Selector:              map[string]string{"app": "envoy"},
			IPFamilyPolicy:        ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), NodePort: nodePort}},
		},
	}
	g.Expect(l.Guest.Client.Create(ctx, guestSvc, client.FieldOwner("helm"))).To(Succeed())
	startIngress := func(w *lab.Worker) *lab.IngressStandIn {
		s, err := l.StartIngressStandIn(ctx, w, lab.IngressStandInOptions{Namespace: guestNS, Name: "envoy-" + w.Machine, Labels: map[string]string{"app": "envoy"}, Service: "envoy", Port: 8080})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(func() { _ = s.Stop(context.Background()) })
		return s
	}
	onA := startIngress(a)
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})

	const ip4, ip6 = "10.98.164.10", "fd00:10:98::164:10"
	addr4, addr6 := net.JoinHostPort(ip4, "80"), net.JoinHostPort(ip6, "80")
	gi := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  gc.Name,
			GuestService: guestnetv1.ObjectReference{Namespace: guestNS, Name: "envoy"},
			Ports:        []guestnetv1.IngressPort{{Name: "http", Port: 80, NodePort: ptr.To[int32](nodePort)}},
			LoadBalancer: guestnetv1.LoadBalancerSpec{
				IPs:                   []string{ip4, ip6},
				Class:                 ingress.CiliumBGPClass,
				ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			},
		},
	}
	g.Expect(c.Create(ctx, gi)).To(Succeed())
	eventuallyGuestIngressReady(t, l, gi)

	hostSvc := &corev1.Service{}
	g.Expect(c.Get(ctx, client.ObjectKey{Namespace: ns, Name: hostnames.HostService(gi)}, hostSvc)).To(Succeed())
	t.Run("the host Service is dual-stack, without selector, with both IPs", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(hostSvc.Spec.Selector).To(BeEmpty())
		g.Expect(hostSvc.Spec.IPFamilyPolicy).To(Equal(ptr.To(corev1.IPFamilyPolicyRequireDualStack)))
		g.Expect(hostSvc.Spec.IPFamilies).To(Equal([]corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}))
		g.Eventually(func(g Gomega) []string {
			g.Expect(c.Get(ctx, client.ObjectKeyFromObject(hostSvc), hostSvc)).To(Succeed())
			var ips []string
			for _, in := range hostSvc.Status.LoadBalancer.Ingress {
				ips = append(ips, in.IP)
			}
			return ips
		}).WithTimeout(giTimeout).Should(ConsistOf(ip4, ip6), "the real LB-IPAM gives both")
	})
	endpoints := func(g Gomega) map[discoveryv1.AddressType][]string {
		slices := &discoveryv1.EndpointSliceList{}
		g.Expect(c.List(ctx, slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: hostSvc.Name})).To(Succeed())
		out := map[discoveryv1.AddressType][]string{}
		for _, s := range slices.Items {
			g.Expect(s.Labels).To(HaveKeyWithValue(discoveryv1.LabelManagedBy, ingress.EndpointSliceManagedBy))
			for _, e := range s.Endpoints {
				out[s.AddressType] = append(out[s.AddressType], e.Addresses[0]+"@"+ptr.Deref(e.NodeName, ""))
			}
		}
		return out
	}
	t.Run("guestnet's EndpointSlices list only the worker that runs the ingress pod", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(endpoints).WithTimeout(giTimeout).Should(Equal(map[discoveryv1.AddressType][]string{
			discoveryv1.AddressTypeIPv4: {a.IP + "@host-node-1"},
			discoveryv1.AddressTypeIPv6: {a.IPv6() + "@host-node-1"},
		}))
	})

	kl, err := l.StartKernelLoadBalancer(ctx, "host-node-1")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kl.Stop)
	client1, err := l.AddExternalClient()
	g.Expect(err).NotTo(HaveOccurred())
	seen := func(addr string) func() (string, error) {
		return func() (string, error) { return lab.SourceSeen(ctx, client1.Dial, addr) }
	}
	t.Run("the guest's ingress pod sees the client's own address, IPv4 and IPv6", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(seen(addr4)).WithTimeout(giTimeout).Should(Equal(client1.IP))
		g.Eventually(seen(addr6)).WithTimeout(giTimeout).Should(Equal(client1.IPv6))
	})
	t.Run("the guest Service turned Cluster: reported, and the address is lost in the VM", func(t *testing.T) {
		g := NewWithT(t)
		setGuestTrafficPolicy(ctx, t, l, guestSvc, corev1.ServiceExternalTrafficPolicyCluster)
		g.Eventually(func() *metav1.Condition {
			return conditions.Get(getGuestIngress(t, l, gi), guestnetv1.GuestServiceReadyCondition)
		}).WithTimeout(giTimeout).Should(And(HaveField("Reason", guestnetv1.GuestServiceTrafficPolicyReason),
			HaveField("Message", ContainSubstring("Set externalTrafficPolicy: Local on it"))))
		g.Eventually(seen(addr4)).WithTimeout(giTimeout).ShouldNot(Equal(client1.IP))
		setGuestTrafficPolicy(ctx, t, l, guestSvc, corev1.ServiceExternalTrafficPolicyLocal)
		eventuallyGuestIngressReady(t, l, gi)
		g.Eventually(seen(addr4)).WithTimeout(giTimeout).Should(Equal(client1.IP))
	})
	t.Run("the ingress pod moves to the other worker: the endpoints follow", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(onA.Stop(ctx)).To(Succeed())
		startIngress(b)
		g.Eventually(endpoints).WithTimeout(giTimeout).Should(Equal(map[discoveryv1.AddressType][]string{
			discoveryv1.AddressTypeIPv4: {b.IP + "@host-node-2"},
			discoveryv1.AddressTypeIPv6: {b.IPv6() + "@host-node-2"},
		}))
		// Where the route now lands (the BGP speaker of the node with the endpoint).
		g.Expect(kl.SetEntryNode(ctx, "host-node-2")).To(Succeed())
		g.Eventually(seen(addr4)).WithTimeout(giTimeout).Should(Equal(client1.IP))
		g.Eventually(seen(addr6)).WithTimeout(giTimeout).Should(Equal(client1.IPv6))
	})
	t.Run("deleting the GuestIngress takes its EndpointSlices", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(c.Delete(ctx, gi)).To(Succeed())
		g.Eventually(func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(gi), &guestnetv1.GuestIngress{}))
		}).WithTimeout(giTimeout).Should(BeTrue())
		g.Eventually(endpoints).WithTimeout(giTimeout).Should(BeEmpty())
	})
}

func setGuestTrafficPolicy(ctx context.Context, t *testing.T, l *lab.Lab, svc *corev1.Service, p corev1.ServiceExternalTrafficPolicy) {
	t.Helper()
	got := &corev1.Service{}
	if err := l.Guest.Client.Get(ctx, client.ObjectKeyFromObject(svc), got); err != nil {
		t.Fatal(err)
	}
	got.Spec.ExternalTrafficPolicy = p
	if err := l.Guest.Client.Update(ctx, got, client.FieldOwner("helm")); err != nil {
		t.Fatal(err)
	}
}
