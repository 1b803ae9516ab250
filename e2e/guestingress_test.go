package e2e

// End-to-end tests of GuestIngress in the two-cluster lab, proving the chain the way the field
// report did: a request to the load-balancer IP goes through
//
//	LB IP:port (Cilium stand-in: L2 announcement + kube-proxy, forwarding to a ready endpoint
//	of the host Service's real EndpointSlices, kept by the real kube-controller-manager)
//	-> worker virt-launcher pod IP:<guest nodePort> (masquerade NAT stand-in: declared ports only)
//	-> VM:<guest nodePort> (Envoy stand-in: answers with its machine name)
//
// Cilium's LB-IPAM is the real one (the IP from guestnet's pool). Everything else is
// real: guestnet's manager (internal/manager wiring, the workerports controller included), the
// host and guest apiservers, CAPI's ClusterCache. The load-balancer IPs are in the lab's
// "physical" range lab.LoadBalancerCIDR, local in the lab's network namespace only.
//
// Run with: make test TEST_PKGS=./e2e/... TEST_ARGS='-run GuestIngress -v'

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/metrics"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/test/metricstest"
)

const giTimeout = 30 * time.Second

// The field report's chain, all of it: requests to the load-balancer IP reach the Envoy
// stand-in on every worker, on both ports; a worker added is reached, a worker removed is
// not; `kubectl get gi` tells the story; deleting the GuestIngress takes the IP away and
// gives the guest Service back as the user had it.
func TestGuestIngress_RequestsThroughTheLoadBalancerIPReachEveryWorker(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("tenant")
	startCiliumStandIn(t, l)

	gc := createIngressCluster(t, l, ns, "tenant-a", 31080, 31443)
	w1 := addEnvoyWorker(t, l, gc, ns+"-md-0-a", "10.244.50.11", 31080, 31443)
	w2 := addEnvoyWorker(t, l, gc, ns+"-md-0-b", "10.244.50.12", 31080, 31443)
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	mgr := l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})

	const ip = "10.98.1.10"
	gi := createGuestIngress(t, l, ns, "web", gc.Name, guestSvc, ip, ptr.To[int32](31080), ptr.To[int32](31443))
	got := eventuallyGuestIngressReady(t, l, gi)
	g.Expect(got.Status.LoadBalancerIP).To(Equal(ip))
	g.Expect(got.Status.ReadyEndpoints).To(BeEquivalentTo(2))
	// What an operator's Prometheus scrapes from the manager says so too.
	g.Eventually(func(g Gomega) map[string]float64 {
		return metricstest.Series(g, mgr, metrics.GuestIngressesName, "status", "reason")
	}).WithTimeout(giTimeout).Should(Equal(map[string]float64{"True/Ready": 1}))

	// Every worker answers through the IP, on each port (once the L2 announcement, which
	// reacts to the same Service status as guestnet, is up).
	for _, port := range []int32{80, 443} {
		g.Eventually(func() []string { return machinesBehind(ctx, ip, port, 8) }).WithTimeout(giTimeout).
			Should(ConsistOf(w1.Machine, w2.Machine), "port %d", port)
	}

	out := kubectl(t, l, "get", "gi", "-n", ns)
	g.Expect(out).To(MatchRegexp(`web\s+tenant-a\s+10\.98\.1\.10\s+2\s+True`), "kubectl get gi:\n%s", out)

	// A worker added (scale up) is reached as soon as its pod is ready; one removed is not.
	w3 := addEnvoyWorker(t, l, gc, ns+"-md-0-c", "10.244.50.13", 31080, 31443)
	g.Eventually(func() []string { return machinesBehind(ctx, ip, 80, 12) }).WithTimeout(giTimeout).
		Should(ConsistOf(w1.Machine, w2.Machine, w3.Machine))
	g.Expect(l.RemoveWorker(ctx, gc, w1)).To(Succeed())
	g.Eventually(func() []string { return machinesBehind(ctx, ip, 80, 12) }).WithTimeout(giTimeout).
		Should(ConsistOf(w2.Machine, w3.Machine))
	g.Eventually(func() int32 { return getGuestIngress(t, l, gi).Status.ReadyEndpoints }).WithTimeout(giTimeout).Should(BeEquivalentTo(2))

	// Deleting the GuestIngress: the IP stops answering, the host objects go, and the guest
	// Service is ClusterIP again, as the user created it.
	g.Expect(l.Host.Client.Delete(ctx, gi)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(l.Host.Client.Get(ctx, client.ObjectKeyFromObject(gi), &guestnetv1.GuestIngress{}))
	}).WithTimeout(giTimeout).Should(BeTrue(), "the finalizer is released once guestnet has undone its work")
	g.Eventually(func() error { _, err := lab.Get(ctx, ip, 80); return err }).WithTimeout(giTimeout).Should(HaveOccurred())
	for _, obj := range []client.Object{&corev1.Service{}, ingress.NewPool(), ingress.NewL2Policy()} {
		key := client.ObjectKey{Name: ns + ".tenant-a-web"}
		if _, ok := obj.(*corev1.Service); ok {
			key = client.ObjectKey{Namespace: ns, Name: "tenant-a-web"}
		}
		err := l.Host.Client.Get(ctx, key, obj)
		g.Expect(apierrors.IsNotFound(err) || (err == nil && !obj.GetDeletionTimestamp().IsZero())).To(BeTrue(), "%T %s left behind", obj, key)
	}
	after := &corev1.Service{}
	g.Expect(l.Guest.Client.Get(ctx, client.ObjectKeyFromObject(guestSvc), after)).To(Succeed())
	g.Expect(after.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP))
	g.Expect(after.Spec.Ports).To(Equal(guestSvc.Spec.Ports))
	g.Expect(after.Spec.Selector).To(Equal(guestSvc.Spec.Selector))
	for _, m := range after.ManagedFields {
		g.Expect(m.Manager).NotTo(Equal(ownership.FieldManager))
	}
}

// Without fixed nodePorts guestnet follows the guest's: when the ingress controller is
// reinstalled on another nodePort, requests through the IP work again within two seconds,
// through guestnet's watch on the guest's Services.
func TestGuestIngress_FollowsAChangedGuestNodePort(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	ns := uniqueName("tenant")
	startCiliumStandIn(t, l)

	// The workers declare the old and the new nodePort (changing declarations is the
	// workerports controller's business, tested on its own).
	gc := createIngressCluster(t, l, ns, "tenant-a", 31180, 31181, 31543)
	w := addWorker(t, l, gc, ns+"-md-0-a", "10.244.51.11", lab.OnKernelDatapath())
	stopOld := serveEnvoy(t, w, 31180)
	serveEnvoy(t, w, 31181)
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeNodePort, []int32{31180, 31543})
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})

	const ip = "10.98.2.10"
	gi := createGuestIngress(t, l, ns, "web", gc.Name, guestSvc, ip, nil, nil)
	eventuallyGuestIngressReady(t, l, gi)
	g.Eventually(func() (string, error) { return lab.Get(ctx, ip, 80) }).WithTimeout(giTimeout).Should(Equal(w.Machine))

	// Reinstall: the old nodePort stops serving, the Service gets another one.
	stopOld()
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := &corev1.Service{}
		if err := l.Guest.Client.Get(ctx, client.ObjectKeyFromObject(guestSvc), svc); err != nil {
			return err
		}
		svc.Spec.Ports[0].NodePort = 31181
		return l.Guest.Client.Update(ctx, svc, client.FieldOwner("helm"))
	})).To(Succeed())
	start := time.Now()
	g.Eventually(func() (string, error) { return lab.Get(ctx, ip, 80) }).
		WithTimeout(2 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(w.Machine))
	t.Logf("requests through %s reached the new nodePort %s after the change", ip, time.Since(start).Round(time.Millisecond))
}

// A nodePort the workers' template does not declare never reaches the VMs: the virt-launcher
// pods refuse it (KubeVirt's NAT rules on the kernel datapath); the host side is all there
// (IP, ready endpoints, the other port answering) and still every request to that port
// fails, as in the field report. guestnet's workerports controller
// declares it on a new template, and the real CAPI and CAPK roll the workers: the VMs
// KubeVirt boots from it (played, held until the failure is shown) answer on both ports, the
// old VMs go.
func TestGuestIngress_UndeclaredNodePortBreaksTheRequestUntilTheWorkersRoll(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	t.Cleanup(cancel)
	ns := uniqueName("tenant")
	startCiliumStandIn(t, l)

	// The template declares the http nodePort, not the https one. Real CAPI and CAPK; every
	// VM the KubeVirt stand-in boots runs the Envoy stand-in on both nodePorts.
	gc, kv := createRealIngressCluster(ctx, t, l, ns, "tenant-a", "10.244.121.0/24", []int32{31280}, 31280, 31643)
	old := kv.Workers()
	g.Expect(old).To(HaveLen(2))
	kv.Hold()
	guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
	l.StartManagerBinary(t, lab.ManagerFlags{Namespace: ns})

	const ip = "10.98.3.10"
	gi := createGuestIngress(t, l, ns, "web", gc.Name, guestSvc, ip, ptr.To[int32](31280), ptr.To[int32](31643))
	g.Eventually(func(g Gomega) {
		got := getGuestIngress(t, l, gi)
		g.Expect(got.Status.LoadBalancerIP).To(Equal(ip))
		g.Expect(got.Status.ReadyEndpoints).To(BeEquivalentTo(2))
		g.Expect(conditions.IsFalse(got, guestnetv1.PortsDeclaredCondition)).To(BeTrue())
	}).WithTimeout(giTimeout).Should(Succeed())
	// The chain is up (port 80 goes through to the VMs), yet port 443 never arrives.
	g.Eventually(func() (string, error) { return lab.Get(ctx, ip, 80) }).WithTimeout(giTimeout).Should(BeElementOf(old[0].Machine, old[1].Machine))
	g.Consistently(func() error { _, err := lab.Get(ctx, ip, 443); return err }).WithTimeout(time.Second).
		Should(HaveOccurred(), "the workers' virt-launcher pods refuse the undeclared nodePort")

	// guestnet repointed the MachineDeployment at a template that declares the nodePorts;
	// CAPI rolls the workers, CAPK creates their VMs from it, KubeVirt boots them.
	g.Eventually(func() (string, error) {
		md := &clusterv1.MachineDeployment{}
		err := l.Host.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.MachineDeployment}, md)
		return md.Spec.Template.Spec.InfrastructureRef.Name, err
	}).WithTimeout(giTimeout).ShouldNot(Equal(gc.WorkerTemplate))
	g.Expect(kv.Release(ctx)).To(Succeed())
	var renewed []*lab.Worker
	g.Eventually(func(g Gomega) {
		renewed = kv.Workers()
		g.Expect(renewed).To(HaveLen(2))
		for _, w := range renewed {
			g.Expect(w.Declared).To(ContainElement(int32(31643)), "VM %s", w.Machine)
		}
		md := &clusterv1.MachineDeployment{}
		g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.MachineDeployment}, md)).To(Succeed())
		g.Expect(ptr.Deref(md.Status.AvailableReplicas, 0)).To(BeEquivalentTo(2))
	}).WithTimeout(realRollout).WithPolling(time.Second).Should(Succeed())
	eventuallyGuestIngressReady(t, l, gi)
	g.Eventually(func() (string, error) { return lab.Get(ctx, ip, 443) }).WithTimeout(giTimeout).
		Should(BeElementOf(renewed[0].Machine, renewed[1].Machine))
}

// Two clusters called tenant-a in two namespaces: each GuestIngress's host Service selects
// its own cluster's workers only, and each IP reaches its own workers only.
func TestGuestIngress_SameClusterNameInTwoNamespacesStayApart(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	startCiliumStandIn(t, l)

	type tenant struct {
		ns, ip   string
		machines []string
		gi       *guestnetv1.GuestIngress
	}
	tenants := []*tenant{{ns: uniqueName("team-a"), ip: "10.98.4.10"}, {ns: uniqueName("team-b"), ip: "10.98.4.20"}}
	for i, tn := range tenants {
		// One guest apiserver serves both clusters in the lab: each has its own guest Service
		// and nodePorts.
		http, https := int32(31380+i), int32(31743+i)
		gc := createIngressCluster(t, l, tn.ns, "tenant-a", http, https)
		for j := range 2 {
			w := addEnvoyWorker(t, l, gc, fmt.Sprintf("%s-md-0-%d", tn.ns, j), fmt.Sprintf("10.244.53.%d", 10*i+j+11), http, https)
			tn.machines = append(tn.machines, w.Machine)
		}
		guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
		l.StartManagerBinary(t, lab.ManagerFlags{Namespace: tn.ns})
		tn.gi = createGuestIngress(t, l, tn.ns, "web", gc.Name, guestSvc, tn.ip, &http, &https)
	}
	for _, tn := range tenants {
		got := eventuallyGuestIngressReady(t, l, tn.gi)
		g.Expect(got.Status.ReadyEndpoints).To(BeEquivalentTo(2), "only its own workers")
		g.Eventually(func() []string { return machinesBehind(ctx, tn.ip, 80, 8) }).WithTimeout(giTimeout).
			Should(ConsistOf(tn.machines), "IP %s reaches %s's workers only", tn.ip, tn.ns)
	}
}

// The same IP asked for by two GuestIngresses in two namespaces: the first keeps working,
// the second is refused with IPConflict naming the first and gets no host objects; when the
// first is deleted, the second takes the IP over and requests reach its workers.
func TestGuestIngress_IPConflictKeepsTheFirstWorking(t *testing.T) {
	g := NewWithT(t)
	l := startLab(t)
	ctx := testContext(t)
	startCiliumStandIn(t, l)
	filter := uniqueName("gi-conflict")
	l.StartManagerBinary(t, lab.ManagerFlags{WatchFilter: filter})

	const ip = "10.98.5.10"
	var gis []*guestnetv1.GuestIngress
	var machines []string
	for i, ns := range []string{uniqueName("first"), uniqueName("second")} {
		http, https := int32(31480+i), int32(31843+i)
		gc := createIngressCluster(t, l, ns, "tenant-a", http, https)
		labelForFilter(t, l, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gc.Name}}, filter)
		w := addEnvoyWorker(t, l, gc, ns+"-md-0-a", fmt.Sprintf("10.244.54.%d", 11+i), http, https)
		machines = append(machines, w.Machine)
		guestSvc := createContourService(t, l, uniqueName("projectcontour"), corev1.ServiceTypeClusterIP, nil)
		gi := newGuestIngress(ns, "web", gc.Name, guestSvc, ip, &http, &https)
		gi.Labels = map[string]string{clusterv1.WatchLabel: filter}
		g.Expect(l.Host.Client.Create(ctx, gi)).To(Succeed())
		gis = append(gis, gi)
		if i == 0 {
			eventuallyGuestIngressReady(t, l, gi)
			g.Eventually(func() (string, error) { return lab.Get(ctx, ip, 80) }).WithTimeout(giTimeout).Should(Equal(w.Machine))
		}
	}

	var c *metav1.Condition
	g.Eventually(func(g Gomega) {
		c = conditions.Get(getGuestIngress(t, l, gis[1]), guestnetv1.LoadBalancerReadyCondition)
		g.Expect(c).NotTo(BeNil())
		g.Expect(c.Reason).To(Equal(guestnetv1.IPConflictReason))
	}).WithTimeout(giTimeout).Should(Succeed())
	g.Expect(c.Message).To(ContainSubstring("IP %s is already claimed by another namespace's GuestIngress", ip))
	g.Expect(c.Message).NotTo(ContainSubstring(gis[0].Namespace), "another namespace's GuestIngress is not named to the tenant")
	g.Expect(apierrors.IsNotFound(l.Host.Client.Get(ctx, client.ObjectKey{Namespace: gis[1].Namespace, Name: "tenant-a-web"}, &corev1.Service{}))).
		To(BeTrue(), "no host Service for the refused GuestIngress")
	g.Consistently(func() []string { return machinesBehind(ctx, ip, 80, 3) }).WithTimeout(2*time.Second).
		Should(ConsistOf(machines[0]), "the first keeps working")

	g.Expect(l.Host.Client.Delete(ctx, gis[0])).To(Succeed())
	eventuallyGuestIngressReady(t, l, gis[1])
	g.Eventually(func() (string, error) { return lab.Get(ctx, ip, 80) }).WithTimeout(giTimeout).Should(Equal(machines[1]))
}

// --- helpers ------------------------------------------------------------------------------------

// startCiliumStandIn runs the real LB-IPAM and the Cilium stand-in (L2 announcement,
// kube-proxy) for the test.
func startCiliumStandIn(t *testing.T, l *lab.Lab) {
	t.Helper()
	s, err := lab.StartCiliumStandIn(testContext(t), l)
	if err != nil {
		t.Fatalf("starting the Cilium stand-in: %v", err)
	}
	t.Cleanup(s.Stop)
}

// createIngressCluster creates a guest cluster whose worker template declares SSH, the
// kubelet and nodePorts, with CAPI's rollout status of a MachineDeployment whose workers all
// run that template.
func createIngressCluster(t *testing.T, l *lab.Lab, ns, name string, nodePorts ...int32) *lab.GuestCluster {
	t.Helper()
	ctx := testContext(t)
	gc, err := l.CreateGuestCluster(ctx, ns, name, lab.WorkerTemplateOptions{Ports: append([]int32{22, 10250}, nodePorts...)})
	if err != nil {
		t.Fatalf("creating guest cluster: %v", err)
	}
	if err := l.SetMachineDeploymentStatus(ctx, gc, 2, 2); err != nil {
		t.Fatalf("setting MachineDeployment status: %v", err)
	}
	return gc
}

// realRollout bounds a real rollout of two workers (CAPK looks at a VM it created again
// after 20 s: it does not watch VMs).
const realRollout = 4 * time.Minute

// createRealIngressCluster creates a guest cluster for the real CAPI and CAPK, started for
// namespace ns, whose worker template declares SSH, the kubelet and declared; the KubeVirt
// stand-in boots its VMs on the kernel datapath (pod IPs from subnet), each running the
// Envoy stand-in on envoyPorts. It returns once CAPI reports both workers available.
func createRealIngressCluster(ctx context.Context, t *testing.T, l *lab.Lab, ns, name, subnet string, declared []int32, envoyPorts ...int32) (*lab.GuestCluster, *lab.KubeVirt) {
	t.Helper()
	g := NewWithT(t)
	capi, err := l.StartCAPI(ctx, ns, ns)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capi.Stop)
	capk, err := l.StartCAPK(ctx, ns)
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capk.Stop)
	gc, err := l.CreateGuestCluster(ctx, ns, name, lab.WorkerTemplateOptions{Ports: append([]int32{22, 10250}, declared...)},
		lab.ForRealCAPI(ns), lab.ForRealCAPK())
	g.Expect(err).NotTo(HaveOccurred())
	kv, err := l.StartKubeVirtStandIn(ctx, ns, lab.KubeVirtOptions{WorkerSubnet: subnet, KernelDatapath: true, OnBoot: func(_ context.Context, w *lab.Worker) error {
		for _, p := range envoyPorts {
			if err := w.ServeMachineName(p); err != nil {
				return err
			}
		}
		return nil
	}})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(kv.Stop)
	g.Eventually(func(g Gomega) {
		md := &clusterv1.MachineDeployment{}
		g.Expect(l.Host.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: gc.MachineDeployment}, md)).To(Succeed())
		g.Expect(ptr.Deref(md.Status.AvailableReplicas, 0)).To(BeEquivalentTo(2))
	}).WithTimeout(realRollout).WithPolling(time.Second).Should(Succeed(), "CAPI's log: %s; CAPK's: %s", capi.LogPath(), capk.LogPath())
	return gc, kv
}

func addWorker(t *testing.T, l *lab.Lab, gc *lab.GuestCluster, machine, ip string, opts ...lab.WorkerOption) *lab.Worker {
	t.Helper()
	w, err := l.AddWorker(testContext(t), gc, machine, ip, opts...)
	if err != nil {
		t.Fatalf("adding worker %s: %v", machine, err)
	}
	return w
}

// addEnvoyWorker adds a worker on the kernel datapath whose VM runs the Envoy stand-in on
// the nodePorts (ip's /24 holds kernel workers only).
func addEnvoyWorker(t *testing.T, l *lab.Lab, gc *lab.GuestCluster, machine, ip string, nodePorts ...int32) *lab.Worker {
	t.Helper()
	w := addWorker(t, l, gc, machine, ip, lab.OnKernelDatapath())
	for _, p := range nodePorts {
		serveEnvoy(t, w, p)
	}
	return w
}

// serveEnvoy runs the Envoy stand-in in the worker's VM on the guest nodePort: an HTTP
// server answering with the worker's machine name (kube-proxy in the VM forwarding to Envoy,
// and Envoy, in one). It returns a function that stops it.
func serveEnvoy(t *testing.T, w *lab.Worker, nodePort int32) func() {
	t.Helper()
	l, err := w.ServeInVM(nodePort)
	if err != nil {
		t.Fatalf("serving in VM %s: %v", w.Machine, err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, w.Machine) }),
		ReadHeaderTimeout: 5 * time.Second,
	}
	go func() { _ = srv.Serve(l) }()
	stop := func() { _ = srv.Close() }
	t.Cleanup(stop)
	return stop
}

// createContourService creates, in the guest namespace ns, the Service of Contour's Envoy as
// its chart makes it (ports http/80 and https/443, named target ports), with nodePorts when
// given, by the user's field manager.
func createContourService(t *testing.T, l *lab.Lab, ns string, svcType corev1.ServiceType, nodePorts []int32) *corev1.Service {
	t.Helper()
	ctx := testContext(t)
	if err := l.Guest.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatalf("creating guest namespace: %v", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "envoy", Labels: map[string]string{"app.kubernetes.io/name": "contour"}},
		Spec: corev1.ServiceSpec{
			Type:     svcType,
			Selector: map[string]string{"app.kubernetes.io/name": "contour", "app.kubernetes.io/component": "envoy"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http")},
				{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("https")},
			},
		},
	}
	for i, p := range nodePorts {
		svc.Spec.Ports[i].NodePort = p
	}
	if err := l.Guest.Client.Create(ctx, svc, client.FieldOwner("helm")); err != nil {
		t.Fatalf("creating guest Service: %v", err)
	}
	return svc
}

func newGuestIngress(ns, name, cluster string, guestSvc *corev1.Service, ip string, httpNodePort, httpsNodePort *int32) *guestnetv1.GuestIngress {
	return &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  cluster,
			GuestService: guestnetv1.ObjectReference{Namespace: guestSvc.Namespace, Name: guestSvc.Name},
			Ports: []guestnetv1.IngressPort{
				{Name: "http", Port: 80, NodePort: httpNodePort},
				{Name: "https", Port: 443, NodePort: httpsNodePort},
			},
			LoadBalancer: guestnetv1.LoadBalancerSpec{
				IP: ip,
				L2: &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^eth0$"}},
			},
		},
	}
}

func createGuestIngress(t *testing.T, l *lab.Lab, ns, name, cluster string, guestSvc *corev1.Service, ip string, httpNodePort, httpsNodePort *int32) *guestnetv1.GuestIngress {
	t.Helper()
	gi := newGuestIngress(ns, name, cluster, guestSvc, ip, httpNodePort, httpsNodePort)
	if err := l.Host.Client.Create(testContext(t), gi); err != nil {
		t.Fatalf("creating GuestIngress: %v", err)
	}
	return gi
}

func getGuestIngress(t *testing.T, l *lab.Lab, gi *guestnetv1.GuestIngress) *guestnetv1.GuestIngress {
	t.Helper()
	got := &guestnetv1.GuestIngress{}
	if err := l.Host.Client.Get(testContext(t), client.ObjectKeyFromObject(gi), got); err != nil {
		t.Fatalf("reading GuestIngress: %v", err)
	}
	return got
}

// eventuallyGuestIngressReady waits until the GuestIngress is Ready, with its IP and endpoints
// in status (conditions and the other status fields are two patches).
func eventuallyGuestIngressReady(t *testing.T, l *lab.Lab, gi *guestnetv1.GuestIngress) *guestnetv1.GuestIngress {
	t.Helper()
	var got *guestnetv1.GuestIngress
	NewWithT(t).Eventually(func(g Gomega) {
		got = getGuestIngress(t, l, gi)
		var states []string
		for _, c := range got.Status.Conditions {
			states = append(states, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
		}
		g.Expect(conditions.IsTrue(got, guestnetv1.ReadyCondition)).To(BeTrue(), strings.Join(states, "\n"))
		g.Expect(got.Status.LoadBalancerIP).NotTo(BeEmpty())
		g.Expect(got.Status.ReadyEndpoints).To(BeNumerically(">", 0))
	}).WithTimeout(giTimeout).WithPolling(100 * time.Millisecond).Should(Succeed())
	return got
}

func labelForFilter(t *testing.T, l *lab.Lab, obj client.Object, filter string) {
	t.Helper()
	ctx := testContext(t)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := l.Host.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		obj.SetLabels(map[string]string{clusterv1.WatchLabel: filter})
		return l.Host.Client.Update(ctx, obj)
	})
	if err != nil {
		t.Fatalf("labelling %s: %v", obj.GetName(), err)
	}
}

// machinesBehind sends n requests to ip:port and returns the distinct machine names that
// answered; a failed request counts as the answer "error: ...".
func machinesBehind(ctx context.Context, ip string, port int32, n int) []string {
	seen := map[string]bool{}
	var out []string
	for range n {
		body, err := lab.Get(ctx, ip, port)
		if err != nil {
			body = "error: " + err.Error()
		}
		if !seen[body] {
			seen[body] = true
			out = append(out, body)
		}
	}
	return out
}

// kubectl runs the lab's kubectl against the host and returns its output.
func kubectl(t *testing.T, l *lab.Lab, args ...string) string {
	t.Helper()
	out, err := l.Assets.KubectlCommand(l.Host.KubeconfigPath, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
