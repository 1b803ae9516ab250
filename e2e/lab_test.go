package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

// The lab's masquerade stand-in behaves as KubeVirt's masquerade binding: with a ports list on
// the interface only declared ports reach the VM; without one every port does.
func TestLab_MasqueradeStandInForwardsOnlyDeclaredPorts(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)

	declaring, err := l.CreateGuestCluster(ctx, uniqueName("masq"), "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, 10250, 30080}})
	g.Expect(err).NotTo(HaveOccurred())
	w, err := l.AddWorker(ctx, declaring, "masq-a", "10.244.1.21")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w.ServeMachineName(30080)).To(Succeed())
	g.Expect(w.ServeMachineName(30443)).To(Succeed())

	g.Expect(lab.Get(ctx, w.IP, 30080)).To(Equal(w.Machine), "a declared port reaches the VM")
	_, err = lab.Get(ctx, w.IP, 30443)
	g.Expect(err).To(HaveOccurred(), "an undeclared port never reaches the VM")

	forwardingAll, err := l.CreateGuestCluster(ctx, uniqueName("masq-all"), "guest-1", lab.WorkerTemplateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	w2, err := l.AddWorker(ctx, forwardingAll, "masq-b", "10.244.1.22")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(w2.ServeMachineName(30443)).To(Succeed())
	g.Expect(lab.Get(ctx, w2.IP, 30443)).To(Equal(w2.Machine), "without a ports list every port reaches the VM")

	g.Expect(l.RemoveWorker(ctx, forwardingAll, w2)).To(Succeed())
	_, err = lab.Get(ctx, w2.IP, 30443)
	g.Expect(err).To(HaveOccurred(), "a removed worker answers nothing")
}

// The Cilium stand-in is the host's kube-proxy too (Cilium replaces it): a host Service's
// ClusterIP forwards, round robin, to the ready endpoints of its real EndpointSlices, and
// follows them when a worker goes; a Service without endpoints is not served (refused).
func TestLab_CiliumStandInServesHostClusterIPs(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("cluster-ip")

	gc, err := l.CreateGuestCluster(ctx, ns, "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, lab.WorkerServicePort}})
	g.Expect(err).NotTo(HaveOccurred())
	var workers []*lab.Worker
	for i, ip := range []string{"10.244.1.43", "10.244.1.44"} {
		w, err := l.AddWorker(ctx, gc, fmt.Sprintf("%s-md-0-%c", ns, 'a'+i), ip)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(w.ServeMachineName(lab.WorkerServicePort)).To(Succeed())
		workers = append(workers, w)
	}
	svc, err := lab.HostServiceForWorkers(ctx, l.Host.Client, ns, "workers", virtlauncher.WorkerSelector(gc.Namespace, gc.Name))
	g.Expect(err).NotTo(HaveOccurred())
	nobody, err := lab.HostServiceForWorkers(ctx, l.Host.Client, ns, "nobody", map[string]string{"app": "nobody"})
	g.Expect(err).NotTo(HaveOccurred())
	startCiliumStandIn(t, l)

	answers := func() map[string]int {
		seen := map[string]int{}
		for range 4 {
			body, err := lab.Get(ctx, svc.Spec.ClusterIP, 80)
			if err != nil {
				body = "error"
			}
			seen[body]++
		}
		return seen
	}
	g.Eventually(answers).WithTimeout(30*time.Second).Should(SatisfyAll(
		HaveKey(workers[0].Machine), HaveKey(workers[1].Machine), Not(HaveKey("error"))), "round robin over both workers")
	g.Consistently(func() error { return dial(nobody.Spec.ClusterIP, 80) }).WithTimeout(time.Second).
		Should(HaveOccurred(), "no endpoints: not served")

	g.Expect(l.RemoveWorker(ctx, gc, workers[1])).To(Succeed())
	g.Eventually(answers).WithTimeout(30*time.Second).Should(Equal(map[string]int{workers[0].Machine: 4}),
		"the endpoints are looked up for each connection")
}

// The guest kube-proxy stand-in serves a guest NodePort Service in every worker VM while a
// ready Pod matches its selector, forwarding to the Pod's IP and (named) target port; a
// server of the VM's own on a nodePort keeps it; a Pod that is not ready, or a Node deleted,
// closes the listeners.
func TestLab_GuestKubeProxyStandInServesNodePorts(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	guest := l.Guest.Client
	ns := uniqueName("kube-proxy")
	const nodePort, heldNodePort, podPort = 30941, 30942, 8080

	gc, err := l.CreateGuestCluster(ctx, ns, "guest-1", lab.WorkerTemplateOptions{Ports: []int32{22, nodePort, heldNodePort}})
	g.Expect(err).NotTo(HaveOccurred())
	a, err := l.AddWorker(ctx, gc, ns+"-md-0-a", "10.244.1.41")
	g.Expect(err).NotTo(HaveOccurred())
	b, err := l.AddWorker(ctx, gc, ns+"-md-0-b", "10.244.1.42")
	g.Expect(err).NotTo(HaveOccurred())
	// The pod runs on worker a (in the lab a guest pod's IP is its VM's address); worker b
	// runs a server of its own on heldNodePort.
	g.Expect(a.ServeMachineName(podPort)).To(Succeed())
	g.Expect(b.ServeMachineName(heldNodePort)).To(Succeed())

	g.Expect(guest.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: a.Machine, Containers: []corev1.Container{{
			Name: "web", Image: "lab.guestnet.dev/web", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: podPort}},
		}}},
	}
	g.Expect(guest.Create(ctx, pod)).To(Succeed())
	setReady := func(ready corev1.ConditionStatus) {
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: a.VMAddress, PodIPs: []corev1.PodIP{{IP: a.VMAddress}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()}}}
		g.Expect(guest.Status().Update(ctx, pod)).To(Succeed())
	}
	setReady(corev1.ConditionTrue)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), NodePort: nodePort},
				{Name: "held", Port: 81, TargetPort: intstr.FromInt32(podPort), NodePort: heldNodePort},
			},
		},
	}
	g.Expect(guest.Create(ctx, svc)).To(Succeed())
	t.Cleanup(func() { _ = guest.Delete(context.Background(), svc) })

	kp, err := lab.StartGuestKubeProxyStandIn(ctx, l)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kp.Stop)

	for _, w := range []*lab.Worker{a, b} {
		g.Eventually(func() (string, error) { return lab.Get(ctx, w.IP, nodePort) }).WithTimeout(30*time.Second).
			Should(Equal(a.Machine), "the nodePort through worker %s reaches the pod on worker a", w.Machine)
	}
	g.Eventually(func() (string, error) { return lab.Get(ctx, a.IP, heldNodePort) }).WithTimeout(30 * time.Second).Should(Equal(a.Machine))
	g.Consistently(func() (string, error) { return lab.Get(ctx, b.IP, heldNodePort) }).WithTimeout(time.Second).
		Should(Equal(b.Machine), "worker b's own server keeps its port")

	setReady(corev1.ConditionFalse)
	g.Eventually(func() error { return dial(a.VMAddress, nodePort) }).WithTimeout(30*time.Second).
		Should(HaveOccurred(), "no ready pod: no listener")
	setReady(corev1.ConditionTrue)
	g.Eventually(func() (string, error) { return lab.Get(ctx, b.IP, nodePort) }).WithTimeout(30 * time.Second).Should(Equal(a.Machine))

	g.Expect(guest.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: b.Machine}})).To(Succeed())
	g.Eventually(func() error { return dial(b.VMAddress, nodePort) }).WithTimeout(30*time.Second).
		Should(HaveOccurred(), "a deleted Node's listeners close")
	g.Expect(lab.Get(ctx, a.IP, nodePort)).To(Equal(a.Machine))
}

// dial opens and closes a TCP connection to host:port.
func dial(host string, port int32) error {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(int(port))), time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// The lab's LB-IPAM is Cilium's own (the operator's lbipam cell, hack/tools/lbipam), not a
// stand-in: a LoadBalancer Service of Cilium's L2 class gets the first IP of the pool that
// selects it and IPAMRequestSatisfied=True (a Service of another class is left alone); a request for an IP another Service holds, or for
// one no pool contains, is refused with Cilium's reasons; of two overlapping pools exactly
// one is marked PoolConflict: the newer, or, created in the same second, either one (never
// both, as guestnet's messages once said).
func TestLab_RealLBIPAM(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	host := l.Host.Client
	ns := uniqueName("lbipam")
	g.Expect(host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	startCiliumStandIn(t, l)

	createPool := func(name, cidr string) {
		p := &unstructured.Unstructured{}
		p.SetGroupVersionKind(schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumLoadBalancerIPPool"})
		p.SetName(name)
		p.Object["spec"] = map[string]any{
			"blocks":          []any{map[string]any{"cidr": cidr}},
			"serviceSelector": map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": ns}},
		}
		g.Expect(host.Create(ctx, p)).To(Succeed())
		t.Cleanup(func() { _ = host.Delete(context.Background(), p) })
	}
	createService := func(name, class, requestedIP string) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{
				Type:              corev1.ServiceTypeLoadBalancer,
				LoadBalancerClass: ptr.To(class),
				Ports:             []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		if requestedIP != "" {
			svc.Annotations = map[string]string{"lbipam.cilium.io/ips": requestedIP}
		}
		g.Expect(host.Create(ctx, svc)).To(Succeed())
	}
	// ipam is the Service's first ingress IP and its IPAMRequestSatisfied status and reason.
	ipam := func(name string) func() (string, error) {
		return func() (string, error) {
			svc := &corev1.Service{}
			if err := host.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, svc); err != nil {
				return "", err
			}
			ip := ""
			if len(svc.Status.LoadBalancer.Ingress) > 0 {
				ip = svc.Status.LoadBalancer.Ingress[0].IP
			}
			c := meta.FindStatusCondition(svc.Status.Conditions, "cilium.io/IPAMRequestSatisfied")
			if c == nil {
				return ip + " (no condition)", nil
			}
			return fmt.Sprintf("%s %s %s", ip, c.Status, c.Reason), nil
		}
	}

	const l2 = "io.cilium/l2-announcer"
	createPool("lbipam-"+ns, "10.98.250.0/29")
	createService("other", "example.com/other", "")
	createService("web", l2, "")
	g.Eventually(ipam("web")).WithTimeout(30*time.Second).Should(Equal("10.98.250.0 True satisfied"), "the first IP of the pool")
	// LB-IPAM handles Service events in order: it has seen "other" before "web".
	g.Expect(ipam("other")()).To(Equal(" (no condition)"), "a class Cilium does not serve is left alone")
	createService("taken", l2, "10.98.250.0")
	g.Eventually(ipam("taken")).WithTimeout(30 * time.Second).Should(Equal(" False already_allocated"))
	createService("nowhere", l2, "10.98.251.1")
	g.Eventually(ipam("nowhere")).WithTimeout(30 * time.Second).Should(Equal(" False no_pool"))

	// Two overlapping pools, created back to back (often in the same second).
	x, y := "lbipam-x-"+ns, "lbipam-y-"+ns
	createPool(x, "10.98.252.0/29")
	createPool(y, "10.98.252.4/30")
	var conflicting []string
	g.Eventually(func(g Gomega) {
		conflicting = nil
		for _, name := range []string{x, y} {
			p := &unstructured.Unstructured{}
			p.SetGroupVersionKind(schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumLoadBalancerIPPool"})
			g.Expect(host.Get(ctx, client.ObjectKey{Name: name}, p)).To(Succeed())
			conds, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
			counted := false
			for _, c := range conds {
				m, _ := c.(map[string]any)
				counted = counted || m["type"] == "cilium.io/IPsTotal"
				if m["type"] == "cilium.io/PoolConflict" && m["status"] == "True" {
					conflicting = append(conflicting, name)
				}
			}
			// LB-IPAM counts a pool's IPs after it settled the conflicts of its event.
			g.Expect(counted).To(BeTrue(), "LB-IPAM has not counted the IPs of %s yet", name)
		}
		g.Expect(conflicting).To(HaveLen(1), "exactly one of two overlapping pools is disabled")
	}).WithTimeout(30 * time.Second).Should(Succeed())
	px, py := &metav1.PartialObjectMetadata{}, &metav1.PartialObjectMetadata{}
	for _, p := range []*metav1.PartialObjectMetadata{px, py} {
		p.SetGroupVersionKind(schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumLoadBalancerIPPool"})
	}
	g.Expect(host.Get(ctx, client.ObjectKey{Name: x}, px)).To(Succeed())
	g.Expect(host.Get(ctx, client.ObjectKey{Name: y}, py)).To(Succeed())
	if px.CreationTimestamp.Before(&py.CreationTimestamp) {
		g.Expect(conflicting).To(Equal([]string{y}), "the newer pool is the one disabled")
	}
	t.Logf("pools created at %s and %s: %v disabled", px.CreationTimestamp, py.CreationTimestamp, conflicting)
}
