package e2e

import (
	"context"
	"errors"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// The client's address through the four NATs of a GuestIngress on the lab's kernel datapath
// (docs/client-source-ip.md): a client on the external network connects to a load-balancer
// IP; the kernel load balancer (Cilium's nodeport load balancing, played with nftables)
// DNATs to a virt-launcher pod IP at the guest nodePort; KubeVirt's own rules DNAT to the VM;
// the real kube-proxy (v1.37.2, nftables mode) in the VM DNATs to the guest ingress pod,
// which answers with the address it saw. The host Service and its EndpointSlices are made by
// hand, as guestnet will make them; the load-balancer IPs are written by hand (IPv6 too: the
// lab's LB-IPAM is IPv4 only).
func TestLab_ClientSourceIPThroughTheFourNATs(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("srcip")
	const (
		nodePort = 30480
		lbIP     = "10.98.122.10"
		lbIP6    = "fd00:10:98::122:10"
	)
	lbAddr, lbAddr6 := net.JoinHostPort(lbIP, "80"), net.JoinHostPort(lbIP6, "80")

	// Two dual-stack VMs, one on each host node; the guest ingress pod runs on a only.
	gc, err := l.CreateGuestCluster(ctx, ns, "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, 10250, nodePort}})
	g.Expect(err).NotTo(HaveOccurred())
	a, err := l.AddWorker(ctx, gc, ns+"-a", "10.244.122.1", lab.DualStack(), lab.OnHostNode("host-node-1"))
	g.Expect(err).NotTo(HaveOccurred())
	b, err := l.AddWorker(ctx, gc, ns+"-b", "10.244.122.2", lab.DualStack(), lab.OnHostNode("host-node-2"))
	g.Expect(err).NotTo(HaveOccurred())
	for _, w := range []*lab.Worker{a, b} {
		start := time.Now()
		kp, err := l.StartGuestKubeProxy(ctx, w, lab.GuestKubeProxyOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		t.Cleanup(kp.Stop)
		t.Logf("kube-proxy in %s ready in %s", w.Machine, time.Since(start).Round(time.Millisecond))
	}

	// The guest: the ingress controller's NodePort Service, dual-stack, and its pod on a.
	guestSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "envoy"},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeNodePort,
			Selector:              map[string]string{"app": "envoy"},
			IPFamilyPolicy:        ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), NodePort: nodePort}},
		},
	}
	g.Expect(l.Guest.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	g.Expect(l.Guest.Client.Create(ctx, guestSvc)).To(Succeed())
	ingress, err := l.StartIngressStandIn(ctx, a, lab.IngressStandInOptions{Namespace: ns, Name: "envoy-a", Labels: map[string]string{"app": "envoy"}, Service: "envoy", Port: 8080})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = ingress.Stop(context.Background()) })

	// The host: a LoadBalancer Service with its EndpointSlices, by hand.
	hostSvc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "guest-1-envoy"},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass:     ptr.To("io.cilium/bgp-control-plane"),
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(nodePort)}},
		},
	}
	g.Expect(l.Host.Client.Create(ctx, hostSvc)).To(Succeed())
	hostSvc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}, {IP: lbIP6}}
	g.Expect(l.Host.Client.Status().Update(ctx, hostSvc)).To(Succeed())
	setHostEndpoints := func(workers ...*lab.Worker) {
		t.Helper()
		for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
			slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: hostSvc.Name + "-" + strings.ToLower(string(family))}}
			_ = l.Host.Client.Delete(ctx, slice)
			slice.Labels = map[string]string{discoveryv1.LabelServiceName: hostSvc.Name, discoveryv1.LabelManagedBy: "test.lab.guestnet.dev"}
			slice.AddressType = family
			slice.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](nodePort), Protocol: ptr.To(corev1.ProtocolTCP)}}
			for _, w := range workers {
				pod := &corev1.Pod{}
				g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: w.Pod}, pod)).To(Succeed())
				addr := w.IP
				if family == discoveryv1.AddressTypeIPv6 {
					addr = w.IPv6()
				}
				slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
					Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
					NodeName:  ptr.To(pod.Spec.NodeName),
					TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod.Name, UID: pod.UID},
				})
			}
			g.Expect(l.Host.Client.Create(ctx, slice)).To(Succeed())
		}
	}
	setHostEndpoints(a) // only the VM that runs the ingress pod, as guestnet will keep them
	setPolicies := func(host, guest corev1.ServiceExternalTrafficPolicy) {
		t.Helper()
		for _, o := range []struct {
			c   client.Client
			svc *corev1.Service
			p   corev1.ServiceExternalTrafficPolicy
		}{{l.Host.Client, hostSvc, host}, {l.Guest.Client, guestSvc, guest}} {
			g.Expect(o.c.Get(ctx, client.ObjectKeyFromObject(o.svc), o.svc)).To(Succeed())
			o.svc.Spec.ExternalTrafficPolicy = o.p
			g.Expect(o.c.Update(ctx, o.svc)).To(Succeed())
		}
	}

	kl, err := l.StartKernelLoadBalancer(ctx, "host-node-1")
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kl.Stop)
	client1, err := l.AddExternalClient()
	g.Expect(err).NotTo(HaveOccurred())
	seen := func(addr string) func() (string, error) {
		return func() (string, error) { return lab.SourceSeen(ctx, client1.Dial, addr) }
	}
	node1, node1v6 := lab.HostNodeAddress("host-node-1")
	node2, node2v6 := lab.HostNodeAddress("host-node-2")

	t.Run("Local and Local: the client's own address", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(seen(lbAddr)).WithTimeout(30 * time.Second).Should(Equal(client1.IP))
		g.Eventually(seen(lbAddr6)).WithTimeout(10 * time.Second).Should(Equal(client1.IPv6))
	})

	t.Run("Local with no endpoint on the entry node: refused by the host", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(kl.SetEntryNode(ctx, "host-node-2")).To(Succeed())
		for _, addr := range []string{lbAddr, lbAddr6} {
			_, err := lab.SourceSeen(ctx, client1.Dial, addr)
			g.Expect(errors.Is(err, syscall.ECONNREFUSED)).To(BeTrue(), "Cilium answers ICMP port unreachable for a frontend without backends: %v", err)
		}
		// Refused by the load balancer's reject (ICMP), not by a RST of the lab namespace.
		rules, err := kl.Ruleset()
		g.Expect(err).NotTo(HaveOccurred())
		for _, daddr := range []string{"ip daddr " + lbIP, "ip6 daddr " + lbIP6} {
			g.Expect(rules).To(MatchRegexp(regexp.QuoteMeta(daddr)+` tcp dport 80 counter packets [1-9]\d* bytes \d+ reject`), "the reject rule counted the SYNs:\n%s", rules)
		}
	})

	t.Run("Cluster on the host, remote backend: the entry node's address", func(t *testing.T) {
		g := NewWithT(t)
		setPolicies(corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal)
		g.Eventually(seen(lbAddr)).WithTimeout(10 * time.Second).Should(Equal(node2))
		g.Eventually(seen(lbAddr6)).WithTimeout(10 * time.Second).Should(Equal(node2v6))
	})

	t.Run("Cluster on the host, backend on the entry node: the client's own address", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(kl.SetEntryNode(ctx, "host-node-1")).To(Succeed())
		g.Eventually(seen(lbAddr)).WithTimeout(10 * time.Second).Should(Equal(client1.IP))
		g.Eventually(seen(lbAddr6)).WithTimeout(10 * time.Second).Should(Equal(client1.IPv6))
		g.Expect([]string{node1, node1v6}).NotTo(ContainElement(client1.IP))
	})

	t.Run("Cluster in the guest: kube-proxy's masquerade, the VM's address towards the pod", func(t *testing.T) {
		g := NewWithT(t)
		setPolicies(corev1.ServiceExternalTrafficPolicyLocal, corev1.ServiceExternalTrafficPolicyCluster)
		g.Eventually(seen(lbAddr)).WithTimeout(10 * time.Second).Should(Equal("10.245.122.254"))
		g.Eventually(seen(lbAddr6)).WithTimeout(10 * time.Second).Should(Equal("fd00:10:245:122::fe"))
	})

	t.Run("Local and Local, host endpoint on a VM without the ingress pod: dropped by kube-proxy", func(t *testing.T) {
		g := NewWithT(t)
		setPolicies(corev1.ServiceExternalTrafficPolicyLocal, corev1.ServiceExternalTrafficPolicyLocal)
		setHostEndpoints(a, b)
		g.Expect(kl.SetEntryNode(ctx, "host-node-2")).To(Succeed())
		g.Eventually(func() string { r, _ := kl.Ruleset(); return r }).WithTimeout(10 * time.Second).Should(ContainSubstring("dnat ip to " + b.IP + ":"))
		for _, addr := range []string{lbAddr, lbAddr6} {
			dialCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := lab.SourceSeen(dialCtx, client1.Dial, addr)
			cancel()
			g.Expect(err).To(HaveOccurred(), "no ingress pod on %s: the guest's kube-proxy drops what its Local nodePort gets", b.Machine)
			g.Expect(errors.Is(err, syscall.ECONNREFUSED)).To(BeFalse(), "dropped, not refused: %v", err)
		}
		// The same request through the VM that runs the ingress pod keeps working.
		g.Expect(kl.SetEntryNode(ctx, "host-node-1")).To(Succeed())
		g.Eventually(seen(lbAddr)).WithTimeout(10 * time.Second).Should(Equal(client1.IP))
	})
}
