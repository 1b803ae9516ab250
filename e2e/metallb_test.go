package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
)

// The real MetalLB (docs/lab.md, "MetalLB in the lab") allocates and announces as guestnet
// will use it: a pool whose serviceAllocation admits one Service gives that Service the IP
// it asks for with metallb.io/loadBalancerIPs and refuses it to a Service of another
// namespace or one its selector does not select; an L2Advertisement of the pool makes one
// speaker answer ARP for the IP on the nodes' segment (the one MetalLB reports in the
// ServiceL2Status), with externalTrafficPolicy Local one on a node with a ready endpoint,
// following the endpoints; without advertisement, endpoint or pool nobody answers.
func TestLab_MetalLBL2(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	c := l.Host.Client

	start := time.Now()
	m, err := l.StartMetalLB(ctx, lab.MetalLBOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(m.Stop)
	t.Logf("MetalLB controller and %d speakers ready in %s", len(m.Speakers), time.Since(start).Round(time.Millisecond))

	ns, other := uniqueName("metallb"), uniqueName("metallb-other")
	for _, n := range []string{ns, other} {
		g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})).To(Succeed())
	}
	const ip, ip2 = "10.98.161.10", "10.98.161.11"
	ingress := map[string]string{"guestnet.dev/ingress": "web"}

	pool := metallbObject(lab.MetalLBIPAddressPoolGVK, "pool-"+ns, map[string]any{
		"addresses":  []any{ip + "/32", ip2 + "/32"},
		"autoAssign": false,
		"serviceAllocation": map[string]any{
			"namespaces":       []any{ns},
			"serviceSelectors": []any{map[string]any{"matchLabels": toAny(ingress)}},
		},
	})
	g.Expect(c.Create(ctx, pool)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), pool) })

	// The admitted Service, and two the pool refuses (the IPs they ask for are the pool's).
	web := metallbService(ns, "web", ip, ingress)
	unselected := metallbService(ns, "unselected", ip2, nil)
	elsewhere := metallbService(other, "web", ip2, ingress)
	for _, svc := range []*corev1.Service{web, unselected, elsewhere} {
		g.Expect(c.Create(ctx, svc)).To(Succeed())
	}

	t.Run("the pool gives the selected Service of its namespace the IP it asks for", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(ingressIP(ctx, c, web)).WithTimeout(30 * time.Second).Should(Equal(ip))
		g.Eventually(eventReasons(ctx, c, web)).Should(ContainElement("IPAllocated"))
	})
	t.Run("the pool refuses a Service its selector does not select, and one of another namespace", func(t *testing.T) {
		g := NewWithT(t)
		for _, svc := range []*corev1.Service{unselected, elsewhere} {
			g.Eventually(eventMessages(ctx, c, svc, "AllocationFailed")).WithTimeout(30*time.Second).Should(
				ContainElement(ContainSubstring("pool pool-"+ns+" not compatible for ip assignment")), svc.Namespace+"/"+svc.Name)
			g.Consistently(ingressIP(ctx, c, svc)).WithTimeout(2*time.Second).Should(BeEmpty(), svc.Namespace+"/"+svc.Name)
		}
	})

	// Backends of web, played Pods on either node, that the real EndpointSlice controller
	// turns into endpoints with their nodeName.
	node1, node2 := m.Speakers[0].Node, m.Speakers[1].Node
	backend1 := createBackendPod(ctx, t, c, ns, "backend-1", node1, "10.244.161.1")
	backend2 := createBackendPod(ctx, t, c, ns, "backend-2", node2, "10.244.161.2")
	setPodReady(ctx, t, c, backend2, false)

	announcing := func() ([]string, error) { return m.AnnouncingNodes(ip) }
	t.Run("without an L2Advertisement nobody answers ARP for the IP", func(t *testing.T) {
		g := NewWithT(t)
		g.Consistently(announcing).WithTimeout(3 * time.Second).Should(BeEmpty())
	})

	adv := metallbObject(lab.MetalLBL2AdvertisementGVK, "l2-"+ns, map[string]any{
		"ipAddressPools": []any{"pool-" + ns},
		"nodeSelectors":  []any{map[string]any{"matchLabels": map[string]any{lab.MetalLBSpeakerLabel: "true"}}},
		"interfaces":     []any{"eth0"},
	})
	g.Expect(c.Create(ctx, adv)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), adv) })

	t.Run("with the L2Advertisement one node answers ARP, the one MetalLB reports", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(announcing).WithTimeout(30 * time.Second).Should(HaveLen(1))
		nodes, err := announcing()
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(nodes).To(ConsistOf(BeElementOf(node1, node2)))
		g.Eventually(l2StatusNodes(ctx, c, web)).Should(Equal(nodes))
		t.Logf("externalTrafficPolicy Cluster: %s announces %s", nodes[0], ip)
	})

	g.Expect(patchService(ctx, c, web, `{"spec":{"externalTrafficPolicy":"Local"}}`)).To(Succeed())
	t.Run("externalTrafficPolicy Local: the node of the ready endpoint answers", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(announcing).WithTimeout(30 * time.Second).Should(Equal([]string{node1}))
		g.Eventually(l2StatusNodes(ctx, c, web)).Should(Equal([]string{node1}))
	})
	t.Run("externalTrafficPolicy Local: the announcement follows the ready endpoint to the other node", func(t *testing.T) {
		g := NewWithT(t)
		setPodReady(ctx, t, c, backend2, true)
		setPodReady(ctx, t, c, backend1, false)
		g.Eventually(announcing).WithTimeout(30 * time.Second).Should(Equal([]string{node2}))
		g.Eventually(l2StatusNodes(ctx, c, web)).Should(Equal([]string{node2}))
	})
	t.Run("no ready endpoint: nobody answers", func(t *testing.T) {
		g := NewWithT(t)
		setPodReady(ctx, t, c, backend2, false)
		g.Eventually(announcing).WithTimeout(30 * time.Second).Should(BeEmpty())
		g.Consistently(announcing).WithTimeout(2 * time.Second).Should(BeEmpty())
	})
	t.Run("the advertisement deleted: nobody answers", func(t *testing.T) {
		g := NewWithT(t)
		setPodReady(ctx, t, c, backend1, true)
		g.Eventually(announcing).WithTimeout(30 * time.Second).Should(Equal([]string{node1}))
		g.Expect(c.Delete(ctx, adv)).To(Succeed())
		g.Eventually(announcing).WithTimeout(30 * time.Second).Should(BeEmpty())
	})
	t.Run("the pool deleted: the Service loses its IP", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(c.Delete(ctx, pool)).To(Succeed())
		g.Eventually(ingressIP(ctx, c, web)).WithTimeout(30 * time.Second).Should(BeEmpty())
	})
}

// metallbObject is a MetalLB configuration object in MetalLB's namespace.
func metallbObject(gvk schema.GroupVersionKind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(lab.MetalLBNamespace)
	u.SetName(name)
	return u
}

func toAny(m map[string]string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// metallbService is a LoadBalancer Service of MetalLB's class asking for ip, selecting the
// backends createBackendPod makes.
func metallbService(ns, name, ip string, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, Labels: labels,
			Annotations: map[string]string{"metallb.io/loadBalancerIPs": ip},
		},
		Spec: corev1.ServiceSpec{
			Type:              corev1.ServiceTypeLoadBalancer,
			LoadBalancerClass: ptr.To(lab.MetalLBClass),
			Selector:          map[string]string{"app": "metallb-backend"},
			Ports:             []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

func ingressIP(ctx context.Context, c client.Client, svc *corev1.Service) func() (string, error) {
	return func() (string, error) {
		got := &corev1.Service{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(svc), got); err != nil {
			return "", err
		}
		var ips []string
		for _, in := range got.Status.LoadBalancer.Ingress {
			ips = append(ips, in.IP)
		}
		return strings.Join(ips, ","), nil
	}
}

func serviceEvents(ctx context.Context, c client.Client, svc *corev1.Service) ([]corev1.Event, error) {
	events := &corev1.EventList{}
	if err := c.List(ctx, events, client.InNamespace(svc.Namespace)); err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "Service" && e.InvolvedObject.Name == svc.Name {
			out = append(out, e)
		}
	}
	return out, nil
}

func eventReasons(ctx context.Context, c client.Client, svc *corev1.Service) func() ([]string, error) {
	return func() ([]string, error) {
		events, err := serviceEvents(ctx, c, svc)
		var reasons []string
		for _, e := range events {
			reasons = append(reasons, e.Reason)
		}
		return reasons, err
	}
}

func eventMessages(ctx context.Context, c client.Client, svc *corev1.Service, reason string) func() ([]string, error) {
	return func() ([]string, error) {
		events, err := serviceEvents(ctx, c, svc)
		var msgs []string
		for _, e := range events {
			if e.Reason == reason {
				msgs = append(msgs, e.Message)
			}
		}
		return msgs, err
	}
}

// l2StatusNodes are the nodes of the ServiceL2Status objects the speakers keep for svc
// (status.node: the node announcing it).
func l2StatusNodes(ctx context.Context, c client.Client, svc *corev1.Service) func() ([]string, error) {
	return func() ([]string, error) {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(lab.MetalLBServiceL2StatusGVK.GroupVersion().WithKind("ServiceL2StatusList"))
		if err := c.List(ctx, list, client.InNamespace(lab.MetalLBNamespace)); err != nil {
			return nil, err
		}
		var nodes []string
		for _, s := range list.Items {
			name, _, _ := unstructured.NestedString(s.Object, "status", "serviceName")
			namespace, _, _ := unstructured.NestedString(s.Object, "status", "serviceNamespace")
			node, _, _ := unstructured.NestedString(s.Object, "status", "node")
			if name == svc.Name && namespace == svc.Namespace {
				nodes = append(nodes, node)
			}
		}
		return nodes, nil
	}
}

func patchService(ctx context.Context, c client.Client, svc *corev1.Service, patch string) error {
	return c.Patch(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name}},
		client.RawPatch("application/merge-patch+json", []byte(patch)))
}

// createBackendPod creates a played, ready Pod labelled app=metallb-backend on node with ip.
func createBackendPod(ctx context.Context, t *testing.T, c client.Client, ns, name, node, ip string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "metallb-backend"}},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}},
		},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	setPodReady(ctx, t, c, pod, true)
	return pod
}

// setPodReady sets the played Pod's Ready and ContainersReady conditions.
func setPodReady(ctx context.Context, t *testing.T, c client.Client, pod *corev1.Pod, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	now := metav1.Now()
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
	}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatalf("setting pod %s ready=%v: %v", pod.Name, ready, err)
	}
}

// MetalLB's native BGP against the lab's BGP router (GoBGP): with a BGPPeer and a
// BGPAdvertisement of the pool carrying communities, every speaker's node advertises the
// Service's IP as a /32 with its own address as next hop and the communities; with
// externalTrafficPolicy Local only the node of a ready endpoint does; the routes are
// withdrawn when the advertisement goes, and when the pool goes.
func TestLab_MetalLBBGP(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	c := l.Host.Client

	m, err := l.StartMetalLB(ctx, lab.MetalLBOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(m.Stop)
	const routerAddress, routerASN, speakerASN = "10.244.0.160", 65000, 64512
	router, err := l.StartBGPRouter(ctx, lab.BGPRouterOptions{
		Address: routerAddress, ASN: routerASN,
		DynamicNeighbors: []lab.BGPDynamicNeighbor{{Prefix: lab.MetalLBSegmentCIDR, ASN: speakerASN}},
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(router.Stop)

	ns := uniqueName("metallb-bgp")
	g.Expect(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	const ip = "10.98.161.20"
	prefix := ip + "/32"
	ingress := map[string]string{"guestnet.dev/ingress": "web"}
	peer := metallbObject(lab.MetalLBBGPPeerGVK, "router-"+ns, map[string]any{
		"myASN": int64(speakerASN), "peerASN": int64(routerASN), "peerAddress": routerAddress,
	})
	g.Expect(c.Create(ctx, peer)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), peer) })
	newPool := func() *unstructured.Unstructured {
		return metallbObject(lab.MetalLBIPAddressPoolGVK, "pool-"+ns, map[string]any{
			"addresses":  []any{prefix},
			"autoAssign": false,
			"serviceAllocation": map[string]any{
				"namespaces":       []any{ns},
				"serviceSelectors": []any{map[string]any{"matchLabels": toAny(ingress)}},
			},
		})
	}
	pool := newPool()
	g.Expect(c.Create(ctx, pool)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), newPool()) })
	newAdv := func() *unstructured.Unstructured {
		return metallbObject(lab.MetalLBBGPAdvertisementGVK, "bgp-"+ns, map[string]any{
			"ipAddressPools":    []any{"pool-" + ns},
			"aggregationLength": int64(32),
			"communities":       []any{"65000:100", "65535:65281"},
		})
	}
	adv := newAdv()
	g.Expect(c.Create(ctx, adv)).To(Succeed())
	t.Cleanup(func() { _ = c.Delete(context.Background(), newAdv()) })

	web := metallbService(ns, "web", ip, ingress)
	g.Expect(c.Create(ctx, web)).To(Succeed())
	node1, node2 := m.Speakers[0], m.Speakers[1]
	backend1 := createBackendPod(ctx, t, c, ns, "backend-1", node1.Node, "10.244.162.1")
	backend2 := createBackendPod(ctx, t, c, ns, "backend-2", node2.Node, "10.244.162.2")
	g.Eventually(ingressIP(ctx, c, web)).WithTimeout(30 * time.Second).Should(Equal(ip))

	nextHops := func() ([]string, error) {
		routes, err := router.RoutesFor(ctx, prefix)
		var hops []string
		for _, r := range routes {
			hops = append(hops, r.NextHop)
		}
		return hops, err
	}
	t.Run("every speaker's node advertises the /32 with its address as next hop and the communities", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(nextHops).WithTimeout(60*time.Second).Should(ConsistOf(node1.Address, node2.Address), "peers: %v", peersOf(ctx, router))
		routes, err := router.RoutesFor(ctx, prefix)
		g.Expect(err).NotTo(HaveOccurred())
		for _, r := range routes {
			g.Expect(r.Peer).To(Equal(r.NextHop))
			g.Expect(r.ASPath).To(Equal([]uint32{speakerASN}))
			g.Expect(r.Communities).To(ConsistOf("65000:100", "no-export"))
		}
	})
	t.Run("externalTrafficPolicy Local: only the node of the ready endpoint advertises", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(patchService(ctx, c, web, `{"spec":{"externalTrafficPolicy":"Local"}}`)).To(Succeed())
		setPodReady(ctx, t, c, backend2, false)
		g.Eventually(nextHops).WithTimeout(30 * time.Second).Should(Equal([]string{node1.Address}))
		setPodReady(ctx, t, c, backend2, true)
		setPodReady(ctx, t, c, backend1, false)
		g.Eventually(nextHops).WithTimeout(30 * time.Second).Should(Equal([]string{node2.Address}))
	})
	t.Run("the advertisement deleted: the route is withdrawn", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(c.Delete(ctx, adv)).To(Succeed())
		g.Eventually(nextHops).WithTimeout(30 * time.Second).Should(BeEmpty())
	})
	t.Run("the pool deleted: the route is withdrawn", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(c.Create(ctx, newAdv())).To(Succeed())
		g.Eventually(nextHops).WithTimeout(30 * time.Second).Should(Equal([]string{node2.Address}))
		g.Expect(c.Delete(ctx, pool)).To(Succeed())
		g.Eventually(nextHops).WithTimeout(30 * time.Second).Should(BeEmpty())
		g.Eventually(ingressIP(ctx, c, web)).WithTimeout(30 * time.Second).Should(BeEmpty())
	})
}

func peersOf(ctx context.Context, r *lab.BGPRouter) []lab.BGPPeer {
	peers, _ := r.Peers(ctx)
	return peers
}
