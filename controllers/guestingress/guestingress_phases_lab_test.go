package guestingress_test

// Lab tests of what the GuestIngress controller does (guestingress_phases.go) against the
// lab's real host and guest apiservers, the real kube-controller-manager (EndpointSlices,
// garbage collector) and Cilium's real CRDs, with the Cilium stand-in (e2e/lab) playing
// LB-IPAM. Traffic through the load-balancer IP is proven end to end in e2e/guestingress_test.go.
//
// Every test works in namespaces of its own (host and guest), with load-balancer IPs, worker
// IPs and guest nodePorts of its own, so the tests run in parallel in one lab.
//
// Run with: make test TEST_PKGS=./controllers/guestingress/... TEST_ARGS='-run GuestIngress -v'

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/internal/controllertest"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/virtlauncher"
)

const (
	waitTimeout = 30 * time.Second
	poll        = 100 * time.Millisecond
)

// The guest ingress controller's Service as a chart installs it: ClusterIP, ports 80 and 443
// with named target ports, its own labels and annotations, created by the user's field
// manager.
func TestGuestIngressPhases_ExposesTheGuestServiceOnTheHost(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	guestSvc := e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 2)
	gi := e.createGuestIngress("web", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{
			Interfaces:   []string{"^eth0$", "^bond[0-9]+$"},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"node-role.kubernetes.io/worker": ""}},
		}
		gi.Spec.LoadBalancer.Annotations = map[string]string{"example.com/team": "web"}
		gi.Spec.LoadBalancer.Labels = map[string]string{"example.com/tier": "edge"}
	})

	got := e.eventuallyReady(gi)
	ip := e.ip(10)
	e.g.Expect(got.Status.LoadBalancerIP).To(Equal(ip))
	e.g.Expect(got.Status.ReadyEndpoints).To(BeEquivalentTo(2))
	e.g.Expect(got.Status.HostService).To(Equal("tenant-a-web"))
	e.g.Expect(got.Status.Ports).To(Equal([]guestnetv1.IngressPortStatus{
		{Name: "http", Port: 80, NodePort: e.nodePort(0)}, {Name: "https", Port: 443, NodePort: e.nodePort(1)},
	}))
	for _, c := range []string{guestnetv1.GuestServiceReadyCondition, guestnetv1.LoadBalancerReadyCondition, guestnetv1.EndpointsReadyCondition} {
		e.g.Expect(conditions.IsTrue(got, c)).To(BeTrue(), "%s: %v", c, conditions.Get(got, c))
	}

	// Guest: NodePort with the fixed nodePorts; guestnet owns type and nodePorts, nothing else
	// of the user's Service changed ...
	svc := e.getGuestService()
	e.g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeNodePort))
	e.g.Expect(svc.Spec.Ports).To(HaveLen(2))
	e.g.Expect(svc.Spec.Ports[0]).To(MatchFields(e.nodePort(0), "http", 80, intstr.FromString("envoy-http")))
	e.g.Expect(svc.Spec.Ports[1]).To(MatchFields(e.nodePort(1), "https", 443, intstr.FromString("envoy-https")))
	e.g.Expect(svc.Spec.Selector).To(Equal(guestSvc.Spec.Selector))
	e.g.Expect(svc.Labels).To(Equal(guestSvc.Labels))
	// ... but the record of what guestnet changed, to hand it back exactly.
	e.g.Expect(svc.Annotations).To(Equal(map[string]string{
		"meta.helm.sh/release-name":                 "contour",
		"guestnet.addons.cluster.x-k8s.io/original": `{"type":"ClusterIP","nodePorts":[{"port":80,"protocol":"TCP"},{"port":443,"protocol":"TCP"}]}`,
	}))
	e.g.Expect(ownedFields(svc, ownership.FieldManager)).To(ConsistOf(
		"f:metadata.f:annotations.f:guestnet.addons.cluster.x-k8s.io/original",
		"f:spec.f:type",
		`f:spec.f:ports.k:{"port":443,"protocol":"TCP"}.f:nodePort`,
		`f:spec.f:ports.k:{"port":443,"protocol":"TCP"}.f:port`,
		`f:spec.f:ports.k:{"port":443,"protocol":"TCP"}.f:protocol`,
		`f:spec.f:ports.k:{"port":80,"protocol":"TCP"}.f:nodePort`,
		`f:spec.f:ports.k:{"port":80,"protocol":"TCP"}.f:port`,
		`f:spec.f:ports.k:{"port":80,"protocol":"TCP"}.f:protocol`,
	))

	// Host Service: exactly the worker selector, targetPort = guest nodePort, Cilium's class,
	// the fixed IP requested from LB-IPAM, user labels and annotations plus traceability
	// labels, owned by the GuestIngress.
	host := e.getHostService("tenant-a-web")
	e.g.Expect(host.Spec.Type).To(Equal(corev1.ServiceTypeLoadBalancer))
	e.g.Expect(host.Spec.Selector).To(Equal(map[string]string{
		"cluster.x-k8s.io/cluster-name": "tenant-a", "cluster.x-k8s.io/role": "worker", "kubevirt.io": "virt-launcher",
		"capk.cluster.x-k8s.io/kubevirt-machine-namespace": e.ns,
	}))
	e.g.Expect(host.Spec.Ports).To(HaveLen(2))
	e.g.Expect(host.Spec.Ports[0]).To(MatchFields(host.Spec.Ports[0].NodePort, "http", 80, intstr.FromInt32(e.nodePort(0))))
	e.g.Expect(host.Spec.Ports[1]).To(MatchFields(host.Spec.Ports[1].NodePort, "https", 443, intstr.FromInt32(e.nodePort(1))))
	e.g.Expect(host.Spec.LoadBalancerClass).To(Equal(ptr.To("io.cilium/l2-announcer")))
	e.g.Expect(host.Spec.ExternalTrafficPolicy).To(Equal(corev1.ServiceExternalTrafficPolicyCluster))
	e.g.Expect(host.Annotations).To(Equal(map[string]string{"lbipam.cilium.io/ips": ip, "example.com/team": "web"}))
	e.g.Expect(host.Labels).To(Equal(map[string]string{
		"example.com/tier":                                         "edge",
		"app.kubernetes.io/managed-by":                             "guestnet",
		"cluster.x-k8s.io/cluster-name":                            "tenant-a",
		"guestnet.addons.cluster.x-k8s.io/guestingress-namespace":  e.ns,
		"guestnet.addons.cluster.x-k8s.io/guestingress-name":       "web",
		"guestnet.addons.cluster.x-k8s.io/guest-service-namespace": e.guestNS,
		"guestnet.addons.cluster.x-k8s.io/guest-service-name":      "envoy",
	}))
	e.g.Expect(host.OwnerReferences).To(ConsistOf(metav1.OwnerReference{
		APIVersion: guestnetv1.GroupVersion.String(), Kind: "GuestIngress", Name: "web", UID: got.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}))

	// Pool and policy, read back through Cilium's real CRD schema (nothing pruned), named
	// after namespace, cluster and GuestIngress.
	pool := e.getCilium(ingress.PoolGVK.Kind, e.ns+".tenant-a-web")
	e.g.Expect(pool.Object["spec"]).To(Equal(map[string]any{
		"blocks":          []any{map[string]any{"cidr": ip + "/32"}},
		"disabled":        false, // Cilium's schema default
		"serviceSelector": map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": e.ns, "io.kubernetes.service.name": "tenant-a-web"}},
	}))
	e.g.Expect(pool.GetLabels()).To(HaveKeyWithValue("guestnet.addons.cluster.x-k8s.io/guestingress-name", "web"))
	e.g.Expect(pool.GetAnnotations()).To(HaveKeyWithValue("guestnet.addons.cluster.x-k8s.io/guestingress", e.ns+"/web"))
	policy := e.getCilium(ingress.L2PolicyGVK.Kind, e.ns+".tenant-a-web")
	e.g.Expect(policy.Object["spec"]).To(Equal(map[string]any{
		"serviceSelector": map[string]any{"matchLabels": map[string]any{"io.kubernetes.service.namespace": e.ns, "io.kubernetes.service.name": "tenant-a-web"}},
		"nodeSelector":    map[string]any{"matchLabels": map[string]any{"node-role.kubernetes.io/worker": ""}},
		"interfaces":      []any{"^eth0$", "^bond[0-9]+$"},
		"loadBalancerIPs": true,
	}))
}

// A second reconcile with nothing changed writes nothing: no apply, no update, no status
// patch, in the host or in the guest. The reconciler runs with clients that count writes.
func TestGuestIngressPhases_AnUnchangedReconcileWritesNothing(t *testing.T) {
	t.Parallel()
	var host, guest counters
	e := newPhaseEnv(t, envOptions{setup: countingSetup(&host, &guest)})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)
	before := e.resourceVersions()
	// The touch below changes the GuestIngress itself; the counters prove guestnet writes
	// nothing to it (no status patch).
	e.g.Expect(host.writes.Load()).To(BeNumerically(">", 0), "the counters see the writes")

	// Let the reconciles that the last writes caused run out, then count from zero.
	e.g.Eventually(func() int64 { return host.writesSince(time.Second) }).WithTimeout(waitTimeout).Should(BeZero())
	host.reset()
	guest.reset()
	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Annotations = map[string]string{"test.guestnet.dev/touch": "1"} })
	e.g.Eventually(func() int64 { return guest.reads.Load() }).WithTimeout(waitTimeout).Should(BeNumerically(">", 0),
		"the touch makes the controller reconcile (and read the guest Service)")
	e.g.Consistently(func() []string { return append(host.log(), guest.log()...) }).WithTimeout(2 * time.Second).Should(BeEmpty())
	e.g.Expect(e.resourceVersions()).To(Equal(before))
}

// The user's labels and annotations (spec.loadBalancer) are copied to the host Service and
// kept in sync: changed, added and removed. A field of guestnet's changed by hand on the host
// Service is put back.
func TestGuestIngressPhases_HostServiceFollowsTheSpec(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.Labels = map[string]string{"a": "1", "b": "2"}
		gi.Spec.LoadBalancer.Annotations = map[string]string{"x": "1", "y": "2"}
	})
	e.eventuallyReady(gi)

	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.Labels = map[string]string{"a": "changed", "c": "3"}
		gi.Spec.LoadBalancer.Annotations = map[string]string{"y": "2"}
	})
	e.g.Eventually(func(g Gomega) {
		svc := e.getHostService("tenant-a-web")
		g.Expect(svc.Labels).To(HaveKeyWithValue("a", "changed"))
		g.Expect(svc.Labels).To(HaveKeyWithValue("c", "3"))
		g.Expect(svc.Labels).NotTo(HaveKey("b"))
		g.Expect(svc.Annotations).To(Equal(map[string]string{"y": "2", "lbipam.cilium.io/ips": e.ip(10)}))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	// (externalTrafficPolicy Local, which gives the host Service guestnet's own endpoints
	// instead of a selector, needs a BGP or MetalLB class: e2e TestGuestIngress_ClientSourceIPWithLocalTraffic.)

	// Someone edits the selector by hand (the field report's mistake): guestnet puts it back.
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := e.getHostService("tenant-a-web")
		svc.Spec.Selector = map[string]string{lab.VMTemplateLabel: gc.WorkerTemplate}
		return e.host.Update(e.ctx, svc, client.FieldOwner("kubectl-edit"))
	})).To(Succeed())
	e.g.Eventually(func() map[string]string { return e.getHostService("tenant-a-web").Spec.Selector }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(Equal(virtlauncher.WorkerSelector(e.ns, "tenant-a")))
}

// Without fixed nodePorts guestnet follows what the guest allocated, through its watch on
// the guest's Services: a changed nodePort reaches the host Service within two seconds.
func TestGuestIngressPhases_FollowsTheGuestsNodePorts(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeNodePort, []int32{e.nodePort(5), e.nodePort(6)})
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name, func(gi *guestnetv1.GuestIngress) {
		for i := range gi.Spec.Ports {
			gi.Spec.Ports[i].NodePort = nil
		}
	})
	got := e.eventuallyReady(gi)
	e.g.Expect(got.Status.Ports).To(Equal([]guestnetv1.IngressPortStatus{
		{Name: "http", Port: 80, NodePort: e.nodePort(5)}, {Name: "https", Port: 443, NodePort: e.nodePort(6)},
	}))
	e.g.Expect(ownedFields(e.getGuestService(), ownership.FieldManager)).To(ConsistOf("f:spec.f:type"),
		"with nothing fixed, guestnet only keeps the type NodePort (shared with the user's manager)")

	// Someone reinstalls the ingress controller with another nodePort.
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := e.getGuestService()
		svc.Spec.Ports[0].NodePort = e.nodePort(7)
		return e.guest.Update(e.ctx, svc, client.FieldOwner("helm"))
	})).To(Succeed())
	start := time.Now()
	e.g.Eventually(func() intstr.IntOrString { return e.getHostService("tenant-a-web").Spec.Ports[0].TargetPort }).
		WithTimeout(2 * time.Second).WithPolling(50 * time.Millisecond).Should(Equal(intstr.FromInt32(e.nodePort(7))))
	t.Logf("the host Service followed the guest nodePort in %s", time.Since(start).Round(time.Millisecond))
	e.g.Eventually(func() []guestnetv1.IngressPortStatus { return e.getGuestIngress(gi).Status.Ports }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(ContainElement(guestnetv1.IngressPortStatus{Name: "http", Port: 80, NodePort: e.nodePort(7)}))
}

// A guest Service that does not exist yet is waited for (the host Service already exists,
// since the nodePorts are fixed); one that lacks a port says which.
func TestGuestIngressPhases_WaitsForTheGuestService(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	c := e.eventuallyCondition(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServiceNotFoundReason)
	e.g.Expect(c.Message).To(ContainSubstring("Waiting for Service %s/envoy in the guest cluster", e.guestNS))
	e.g.Expect(e.getHostService("tenant-a-web").Spec.Ports[1].TargetPort).To(Equal(intstr.FromInt32(e.nodePort(1))))

	// A Service with port 80 only.
	svc := e.newGuestService(corev1.ServiceTypeClusterIP, nil)
	svc.Spec.Ports = svc.Spec.Ports[:1]
	e.g.Expect(e.guest.Create(e.ctx, svc, client.FieldOwner("helm"))).To(Succeed())
	c = e.eventuallyCondition(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServicePortNotFoundReason)
	e.g.Expect(c.Message).To(ContainSubstring("has no port for https (443/TCP); it has 80/TCP"))
	e.g.Expect(e.getGuestService().Spec.Ports).To(HaveLen(1), "guestnet never adds a port to the user's Service")

	// The port is added (helm upgrade): the chain completes.
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := e.getGuestService()
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: "https", Port: 443, TargetPort: intstr.FromString("envoy-https")})
		return e.guest.Update(e.ctx, svc, client.FieldOwner("helm"))
	})).To(Succeed())
	e.eventuallyReady(gi)
}

// A fixed nodePort that another guest Service holds is refused by the guest apiserver;
// GuestServiceReady names the holder, and the chain completes when the holder lets go.
func TestGuestIngressPhases_NodePortConflictNamesTheHolder(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	holder := e.newGuestService(corev1.ServiceTypeNodePort, []int32{e.nodePort(0), e.nodePort(9)})
	holder.Name = "other"
	e.g.Expect(e.guest.Create(e.ctx, holder)).To(Succeed())
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)

	c := e.eventuallyCondition(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.NodePortConflictReason)
	e.g.Expect(c.Message).To(ContainSubstring("nodePort %d (port http) is allocated to Service %s/other", e.nodePort(0), e.guestNS))
	e.g.Expect(c.Message).To(ContainSubstring("provided port is already allocated"))
	e.g.Expect(e.getGuestService().Spec.Type).To(Equal(corev1.ServiceTypeClusterIP))
	_, err := e.tryGetHostService("tenant-a-web")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no host Service that would forward to the other Service's nodePort")

	e.g.Expect(e.guest.Delete(e.ctx, holder)).To(Succeed())
	e.eventuallyReady(gi)
}

// The same fixed IP asked for by two GuestIngresses in two namespaces: the older keeps it
// and keeps working, the newer is refused with IPConflict naming the older and gets no host
// objects; when the older goes away, the newer takes over.
func TestGuestIngressPhases_IPConflictAcrossNamespaces(t *testing.T) {
	t.Parallel()
	first := newPhaseEnv(t, envOptions{allNamespaces: true})
	second := first.sibling(t)
	first.createGuestService(corev1.ServiceTypeClusterIP, nil)
	second.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc1 := first.createCluster("tenant-a", 1)
	gc2 := second.createCluster("tenant-a", 1)
	older := first.createGuestIngress("web", gc1.Name)
	first.eventuallyReady(older)
	newer := second.createGuestIngress("web", gc2.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.IP = first.ip(10)
	})

	c := second.eventuallyCondition(newer, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.IPConflictReason)
	e := second
	e.g.Expect(c.Message).To(ContainSubstring("IP %s is already claimed by another namespace's GuestIngress", first.ip(10)))
	e.g.Expect(c.Message).NotTo(ContainSubstring(first.ns), "another namespace's GuestIngress is not named to the tenant")
	e.g.Consistently(func() error { _, err := e.tryGetHostService("tenant-a-web"); return err }).
		WithTimeout(2 * time.Second).Should(Satisfy(apierrors.IsNotFound))
	_, err := e.tryGetCilium(ingress.PoolGVK.Kind, e.ns+".tenant-a-web")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no pool for the refused GuestIngress")
	first.g.Expect(first.getGuestIngress(older).Status.LoadBalancerIP).To(Equal(first.ip(10)), "the older keeps working")
	first.g.Expect(conditions.IsTrue(first.getGuestIngress(older), guestnetv1.ReadyCondition)).To(BeTrue())

	first.g.Expect(first.host.Delete(first.ctx, older)).To(Succeed())
	got := second.eventuallyReady(newer)
	e.g.Expect(got.Status.LoadBalancerIP).To(Equal(first.ip(10)))
}

// guestnet's own pools never overlap: a GuestIngress whose cidrs overlap an older one's is
// refused up front, and so is one whose pool would overlap someone else's pool (Cilium marks
// the newer of two overlapping pools; see also AnAdminPoolIsNeverDisabled).
func TestGuestIngressPhases_PoolConflicts(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	a := e.createGuestIngress("a", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.IP = ""
		gi.Spec.LoadBalancer.CIDRs = []string{e.lbNet + ".0/28"}
	})
	got := e.eventuallyReady(a)
	e.g.Expect(got.Status.LoadBalancerIP).To(Equal(e.ip(0)), "the first IP of the pool: %s", conditionsString(got))
	b := e.createGuestIngress("b", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.IP = ""
		gi.Spec.LoadBalancer.CIDRs = []string{e.lbNet + ".8/29"}
	})
	c := e.eventuallyCondition(b, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.PoolConflictReason)
	e.g.Expect(c.Message).To(ContainSubstring("The pool ranges %s.8/29 overlap %s.0/28 of GuestIngress a of this namespace", e.lbNet, e.lbNet))
	_, err := e.tryGetCilium(ingress.PoolGVK.Kind, e.ns+".tenant-a-b")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue())

	// Someone else's pool, older than the one guestnet creates next.
	userPool := ingress.NewPool()
	userPool.SetName("user-" + e.ns)
	userPool.Object["spec"] = map[string]any{
		"blocks": []any{map[string]any{"cidr": e.lbNet + ".64/27"}},
		// Selects nothing of the tests running alongside (a pool without a selector takes
		// every Service).
		"serviceSelector": map[string]any{"matchLabels": map[string]any{"example.com/pool": "user"}},
	}
	e.g.Expect(e.host.Create(e.ctx, userPool)).To(Succeed())
	t.Cleanup(func() { _ = e.host.Delete(context.Background(), userPool) })
	time.Sleep(1100 * time.Millisecond) // creationTimestamps have a resolution of a second
	d := e.createGuestIngress("d", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.IP = e.ip(70)
	})
	c = e.eventuallyCondition(d, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.PoolConflictReason)
	e.g.Expect(c.Message).To(ContainSubstring("The pool ranges %s are in a pool of the platform", e.ip(70)))
	e.g.Expect(c.Message).NotTo(ContainSubstring("user-"+e.ns), "the platform's pools are not named to the tenant")
	_, err = e.tryGetCilium(ingress.PoolGVK.Kind, e.ns+".tenant-a-d")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a pool that Cilium would mark conflicting")
}

// With poolRef guestnet creates no pool. The pool must be one a GuestIngressPolicy offers:
// not admitted until it exists; a pool pinned to another namespace leaves the IP pending
// with a hint; pinned to this namespace, the Service gets its IP from it.
func TestGuestIngressPhases_PoolRef(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	poolName := "shared-" + e.ns
	offer := lab.LabPolicy()
	offer.Name = "poolref-" + e.ns
	offer.Spec.NamespaceSelector = metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: e.ns}}
	offer.Spec.SharedPools = []string{poolName}
	e.g.Expect(e.host.Create(e.ctx, offer)).To(Succeed())
	t.Cleanup(func() { _ = e.host.Delete(context.Background(), offer) })
	gi := e.createGuestIngress("web", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.IP = ""
		gi.Spec.LoadBalancer.PoolRef = &guestnetv1.PoolReference{Name: poolName}
	})
	c := e.eventuallyCondition(gi, guestnetv1.AdmittedCondition, metav1.ConditionFalse, guestnetv1.NotAllowedReason)
	e.g.Expect(c.Message).To(ContainSubstring("shared pool %s, which does not exist", poolName))
	_, err := e.tryGetCilium(ingress.PoolGVK.Kind, e.ns+".tenant-a-web")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no pool of guestnet's own with poolRef")

	pool := ingress.NewPool()
	pool.SetName(poolName)
	pool.Object["spec"] = map[string]any{
		"blocks":          []any{map[string]any{"cidr": e.lbNet + ".32/28"}},
		"serviceSelector": map[string]any{"matchLabels": map[string]any{ingress.ServiceNamespaceKey: "someone-else"}},
	}
	e.g.Expect(e.host.Create(e.ctx, pool)).To(Succeed())
	t.Cleanup(func() { _ = e.host.Delete(context.Background(), pool) })
	// IPPending says first that the host Service waits for the guest's nodePorts, then why no IP.
	e.eventuallyConditionMessage(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.IPPendingReason,
		fmt.Sprintf("does not select Service %s/tenant-a-web", e.ns))

	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		live := ingress.NewPool()
		if err := e.host.Get(e.ctx, client.ObjectKey{Name: poolName}, live); err != nil {
			return err
		}
		_ = unstructured.SetNestedStringMap(live.Object, map[string]string{ingress.ServiceNamespaceKey: e.ns}, "spec", "serviceSelector", "matchLabels")
		return e.host.Update(e.ctx, live)
	})).To(Succeed())
	got := e.eventuallyReady(gi)
	e.g.Expect(got.Status.LoadBalancerIP).To(Equal(e.lbNet+".32"), "%s", conditionsString(got))
}

// Deleting the GuestIngress deletes the host objects and gives the guest Service back as the
// user had it: a ClusterIP Service that guestnet had made NodePort is ClusterIP again, without
// nodePorts, with every other field as it was and no field owned by guestnet.
func TestGuestIngressPhases_DeletionGivesTheGuestServiceBack(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	before := e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)
	e.g.Expect(e.getGuestService().Spec.Type).To(Equal(corev1.ServiceTypeNodePort))

	e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
	e.eventuallyGone(gi)
	after := e.getGuestService()
	e.g.Expect(after.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP))
	for _, p := range after.Spec.Ports {
		e.g.Expect(p.NodePort).To(BeZero())
	}
	e.g.Expect(after.Spec.Ports).To(Equal(before.Spec.Ports))
	e.g.Expect(after.Spec.Selector).To(Equal(before.Spec.Selector))
	e.g.Expect(after.Labels).To(Equal(before.Labels))
	e.g.Expect(after.Annotations).To(Equal(before.Annotations))
	e.g.Expect(after.Spec.ClusterIP).To(Equal(before.Spec.ClusterIP))
	e.g.Expect(managers(after)).NotTo(ContainElement(ownership.FieldManager))

	_, err := e.tryGetHostService("tenant-a-web")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
		_, err := e.tryGetCilium(kind, e.ns+".tenant-a-web")
		e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s left behind", kind)
	}
}

// When the Cluster is deleted, the host objects go (the workers went with it); the
// GuestIngress stays, waiting for a Cluster of that name.
func TestGuestIngressPhases_ClusterDeletionRemovesTheHostObjects(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)

	e.g.Expect(e.host.Delete(e.ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: gc.Name}})).To(Succeed())
	e.eventuallyCondition(gi, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotFoundReason)
	e.g.Eventually(func() error { _, err := e.tryGetHostService("tenant-a-web"); return err }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(Satisfy(apierrors.IsNotFound))
	for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
		e.g.Eventually(func() error { _, err := e.tryGetCilium(kind, e.ns+".tenant-a-web"); return err }).
			WithTimeout(waitTimeout).WithPolling(poll).Should(Satisfy(apierrors.IsNotFound))
	}
	e.g.Eventually(func() string { return e.getGuestIngress(gi).Status.LoadBalancerIP }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(BeEmpty())
}

// While the Cluster is paused nothing changes on the host; the change lands when it resumes.
func TestGuestIngressPhases_PauseStopsChanges(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)
	rv := e.getHostService("tenant-a-web").ResourceVersion

	e.updateCluster(gc.Name, func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) })
	e.eventuallyCondition(gi, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.Labels = map[string]string{"new": "label"} })
	e.g.Consistently(func() string { return e.getHostService("tenant-a-web").ResourceVersion }).WithTimeout(2 * time.Second).Should(Equal(rv))

	e.updateCluster(gc.Name, func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(false) })
	e.g.Eventually(func() map[string]string { return e.getHostService("tenant-a-web").Labels }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(HaveKeyWithValue("new", "label"))
}

// Zero endpoints says which selector matched nothing and what to check; a worker that
// starts makes the condition True, without a resync.
func TestGuestIngressPhases_EndpointsFollowTheWorkers(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 0)
	gi := e.createGuestIngress("web", gc.Name)
	c := e.eventuallyConditionMessage(gi, guestnetv1.EndpointsReadyCondition, metav1.ConditionFalse, guestnetv1.NoEndpointsReason, "matches no pod")
	e.g.Expect(c.Message).To(ContainSubstring("The selector capk.cluster.x-k8s.io/kubevirt-machine-namespace=%s,cluster.x-k8s.io/cluster-name=tenant-a,cluster.x-k8s.io/role=worker,kubevirt.io=virt-launcher of Service %s/tenant-a-web matches no pod", e.ns, e.ns))
	e.g.Expect(c.Message).To(ContainSubstring("kubectl get pods -n %s -l", e.ns))

	w := e.addWorker(gc)
	got := e.eventuallyCondition(gi, guestnetv1.EndpointsReadyCondition, metav1.ConditionTrue, guestnetv1.ReadyReason)
	e.g.Expect(got.Message).To(ContainSubstring("1 of 1 worker virt-launcher pods"))
	e.g.Expect(e.l.RemoveWorker(e.ctx, gc, w)).To(Succeed())
	e.eventuallyCondition(gi, guestnetv1.EndpointsReadyCondition, metav1.ConditionFalse, guestnetv1.NoEndpointsReason)
	// Conditions and the other status fields are two patches.
	e.g.Eventually(func() int32 { return e.getGuestIngress(gi).Status.ReadyEndpoints }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(BeZero())
}

// --- environment ------------------------------------------------------------------------------

var (
	standInOnce sync.Once
	standInErr  error
	nextEnv     atomic.Int32
)

// ciliumStandIn starts the package's real LB-IPAM and Cilium stand-in (L2 announcement,
// kube-proxy) once; they run until the test binary exits.
func ciliumStandIn(t *testing.T, l *lab.Lab) {
	standInOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, standInErr = lab.StartCiliumStandIn(ctx, l)
	})
	if standInErr != nil {
		t.Fatalf("starting the Cilium stand-in: %v", standInErr)
	}
}

type envOptions struct {
	// allNamespaces runs the manager for every namespace, limited to objects labelled with a
	// watch filter of the test's own (for tests that need two namespaces).
	allNamespaces bool
	// setup registers the controller; setupGuestIngress when nil.
	setup lab.SetupFunc
	// manual starts no manager: the test starts (and stops) its own with runManager.
	manual bool
}

// phaseEnv is one test's namespaces and address space in the package's lab.
type phaseEnv struct {
	t           *testing.T
	g           *WithT
	ctx         context.Context
	l           *lab.Lab
	host, guest client.Client
	ns, guestNS string
	watchFilter string
	// lbNet is the test's /24 of load-balancer IPs ("10.98.<n>"), workerNet its worker pod
	// IPs ("10.244.<n>"), nodePortBase the first of its 20 guest nodePorts.
	lbNet, workerNet string
	nodePortBase     int32
	workers          int
	managers         int
}

func newPhaseEnv(t *testing.T, opts envOptions) *phaseEnv {
	l := controllertest.Lab(t)
	ciliumStandIn(t, l)
	e := newEnvIn(t, l)
	mo := manager.Options{WatchNamespace: e.ns}
	if opts.allNamespaces {
		mo = manager.Options{WatchFilterValue: "gi-" + utilrand.String(6)}
	}
	e.watchFilter = mo.WatchFilterValue
	setup := opts.setup
	if setup == nil {
		setup = setupGuestIngress
	}
	if !opts.manual {
		lab.StartManager(t, l, mo, setup)
	}
	return e
}

func newEnvIn(t *testing.T, l *lab.Lab) *phaseEnv {
	n := nextEnv.Add(1)
	if n > 100 {
		t.Fatalf("too many test environments for the lab's address plan")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	e := &phaseEnv{
		t: t, g: NewWithT(t), ctx: ctx, l: l, host: l.Host.Client, guest: l.Guest.Client,
		ns: "gi-" + utilrand.String(6), guestNS: "contour-" + utilrand.String(6),
		lbNet: fmt.Sprintf("10.98.%d", 10+n), workerNet: fmt.Sprintf("10.244.%d", 10+n),
		nodePortBase: 30000 + 20*n,
	}
	e.g.Expect(e.host.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}})).To(Succeed())
	e.g.Expect(e.guest.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.guestNS}})).To(Succeed())
	return e
}

// sibling is another namespace and address space served by the same manager.
func (e *phaseEnv) sibling(t *testing.T) *phaseEnv {
	s := newEnvIn(t, e.l)
	s.watchFilter = e.watchFilter
	return s
}

func (e *phaseEnv) ip(host int) string     { return fmt.Sprintf("%s.%d", e.lbNet, host) }
func (e *phaseEnv) nodePort(i int32) int32 { return e.nodePortBase + i }
func (e *phaseEnv) labels() map[string]string {
	if e.watchFilter == "" {
		return nil
	}
	return map[string]string{clusterv1.WatchLabel: e.watchFilter}
}

// newGuestService is the ingress controller's Service as Contour's chart makes it: ports
// http/80 and https/443 to named target ports, with nodePorts when given.
func (e *phaseEnv) newGuestService(svcType corev1.ServiceType, nodePorts []int32) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: e.guestNS, Name: "envoy",
			Labels:      map[string]string{"app.kubernetes.io/name": "contour", "app.kubernetes.io/component": "envoy"},
			Annotations: map[string]string{"meta.helm.sh/release-name": "contour"},
		},
		Spec: corev1.ServiceSpec{
			Type:     svcType,
			Selector: map[string]string{"app.kubernetes.io/name": "contour", "app.kubernetes.io/component": "envoy"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromString("envoy-http")},
				{Name: "https", Port: 443, TargetPort: intstr.FromString("envoy-https")},
			},
		},
	}
	for i, np := range nodePorts {
		svc.Spec.Ports[i].NodePort = np
	}
	return svc
}

func (e *phaseEnv) createGuestService(svcType corev1.ServiceType, nodePorts []int32) *corev1.Service {
	e.t.Helper()
	svc := e.newGuestService(svcType, nodePorts)
	e.g.Expect(e.guest.Create(e.ctx, svc, client.FieldOwner("helm"))).To(Succeed())
	return svc
}

func (e *phaseEnv) getGuestService() *corev1.Service {
	e.t.Helper()
	svc := &corev1.Service{}
	e.g.Expect(e.guest.Get(e.ctx, client.ObjectKey{Namespace: e.guestNS, Name: "envoy"}, svc)).To(Succeed())
	return svc
}

// createCluster creates a guest Cluster whose worker template declares the test's nodePorts
// (so the workerports controller has nothing to do), with workers running it.
func (e *phaseEnv) createCluster(name string, workers int) *lab.GuestCluster {
	e.t.Helper()
	gc, err := e.l.CreateGuestCluster(e.ctx, e.ns, name, lab.WorkerTemplateOptions{
		Ports: []int32{22, 10250, e.nodePort(0), e.nodePort(1), e.nodePort(5), e.nodePort(6), e.nodePort(7)},
	})
	e.g.Expect(err).NotTo(HaveOccurred())
	if e.watchFilter != "" {
		e.updateCluster(name, func(c *clusterv1.Cluster) { c.Labels = e.labels() })
	}
	for range workers {
		e.addWorker(gc)
	}
	// CAPI's rollout status (no CAPI controller runs in the lab): the MachineDeployment's
	// two replicas run its template.
	e.g.Expect(e.l.SetMachineDeploymentStatus(e.ctx, gc, 2, 2)).To(Succeed())
	return gc
}

func (e *phaseEnv) addWorker(gc *lab.GuestCluster) *lab.Worker {
	e.t.Helper()
	e.workers++
	w, err := e.l.AddWorker(e.ctx, gc, fmt.Sprintf("%s-w%d", e.ns, e.workers), fmt.Sprintf("%s.%d", e.workerNet, e.workers))
	e.g.Expect(err).NotTo(HaveOccurred())
	return w
}

func (e *phaseEnv) updateCluster(name string, mutate func(*clusterv1.Cluster)) {
	e.t.Helper()
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := &clusterv1.Cluster{}
		if err := e.host.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, c); err != nil {
			return err
		}
		mutate(c)
		return e.host.Update(e.ctx, c)
	})).To(Succeed())
}

// createGuestIngress creates a GuestIngress for the test's guest Service with the fixed
// nodePorts nodePort(0) and nodePort(1) and the fixed IP ip(10), adjusted by mutate.
func (e *phaseEnv) createGuestIngress(name, cluster string, mutate ...func(*guestnetv1.GuestIngress)) *guestnetv1.GuestIngress {
	e.t.Helper()
	gi := &guestnetv1.GuestIngress{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: e.labels()},
		Spec: guestnetv1.GuestIngressSpec{
			ClusterName:  cluster,
			GuestService: guestnetv1.ObjectReference{Namespace: e.guestNS, Name: "envoy"},
			Ports: []guestnetv1.IngressPort{
				{Name: "http", Port: 80, NodePort: ptr.To(e.nodePort(0))},
				{Name: "https", Port: 443, NodePort: ptr.To(e.nodePort(1))},
			},
			LoadBalancer: guestnetv1.LoadBalancerSpec{IP: e.ip(10)},
		},
	}
	for _, m := range mutate {
		m(gi)
	}
	e.g.Expect(e.host.Create(e.ctx, gi)).To(Succeed())
	return gi
}

func (e *phaseEnv) getGuestIngress(gi *guestnetv1.GuestIngress) *guestnetv1.GuestIngress {
	got := &guestnetv1.GuestIngress{}
	e.g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), got)).To(Succeed())
	return got
}

func (e *phaseEnv) updateGuestIngress(gi *guestnetv1.GuestIngress, mutate func(*guestnetv1.GuestIngress)) {
	e.t.Helper()
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := &guestnetv1.GuestIngress{}
		if err := e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), got); err != nil {
			return err
		}
		mutate(got)
		return e.host.Update(e.ctx, got)
	})).To(Succeed())
}

// eventuallyReady waits until the GuestIngress is Ready and returns it.
func (e *phaseEnv) eventuallyReady(gi *guestnetv1.GuestIngress) *guestnetv1.GuestIngress {
	e.t.Helper()
	var got *guestnetv1.GuestIngress
	e.g.Eventually(func(g Gomega) {
		got = &guestnetv1.GuestIngress{}
		g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), got)).To(Succeed())
		g.Expect(conditions.IsTrue(got, guestnetv1.ReadyCondition)).To(BeTrue(), "Ready: %v", conditionsString(got))
		// Conditions and the other status fields are two patches: wait for both.
		g.Expect(got.Status.LoadBalancerIP).NotTo(BeEmpty())
		g.Expect(got.Status.ReadyEndpoints).To(BeNumerically(">", 0))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	return got
}

func conditionsString(gi *guestnetv1.GuestIngress) string {
	var parts []string
	for _, c := range gi.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "\n")
}

func (e *phaseEnv) eventuallyCondition(gi *guestnetv1.GuestIngress, conditionType string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	e.t.Helper()
	var got *metav1.Condition
	e.g.Eventually(func(g Gomega) {
		obj := &guestnetv1.GuestIngress{}
		g.Expect(e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), obj)).To(Succeed())
		got = conditions.Get(obj, conditionType)
		g.Expect(got).NotTo(BeNil(), "%s not reported", conditionType)
		g.Expect(got.Status).To(Equal(status), "%s: %s", conditionType, got.Message)
		g.Expect(got.Reason).To(Equal(reason), "%s: %s", conditionType, got.Message)
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	return got
}

// eventuallyConditionMessage is eventuallyCondition that also waits for the message to
// contain substring.
func (e *phaseEnv) eventuallyConditionMessage(gi *guestnetv1.GuestIngress, conditionType string, status metav1.ConditionStatus, reason, substring string) *metav1.Condition {
	e.t.Helper()
	var got *metav1.Condition
	e.g.Eventually(func(g Gomega) {
		got = e.eventuallyCondition(gi, conditionType, status, reason)
		g.Expect(got.Message).To(ContainSubstring(substring))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	return got
}

func (e *phaseEnv) eventuallyGone(gi *guestnetv1.GuestIngress) {
	e.t.Helper()
	e.g.Eventually(func() bool {
		return apierrors.IsNotFound(e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), &guestnetv1.GuestIngress{}))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(BeTrue())
}

func (e *phaseEnv) tryGetHostService(name string) (*corev1.Service, error) {
	svc := &corev1.Service{}
	return svc, e.host.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, svc)
}

func (e *phaseEnv) getHostService(name string) *corev1.Service {
	e.t.Helper()
	svc, err := e.tryGetHostService(name)
	e.g.Expect(err).NotTo(HaveOccurred())
	return svc
}

func (e *phaseEnv) tryGetCilium(kind, name string) (*unstructured.Unstructured, error) {
	u := ingress.NewPool()
	if kind == ingress.L2PolicyGVK.Kind {
		u = ingress.NewL2Policy()
	}
	return u, e.host.Get(e.ctx, client.ObjectKey{Name: name}, u)
}

func (e *phaseEnv) getCilium(kind, name string) *unstructured.Unstructured {
	e.t.Helper()
	u, err := e.tryGetCilium(kind, name)
	e.g.Expect(err).NotTo(HaveOccurred())
	return u
}

// resourceVersions of the objects guestnet applies for the test's GuestIngress "web" of
// Cluster tenant-a: the guest Service, the host Service, pool and policy.
func (e *phaseEnv) resourceVersions() []string {
	return []string{
		e.getGuestService().ResourceVersion,
		e.getHostService("tenant-a-web").ResourceVersion,
		e.getCilium(ingress.PoolGVK.Kind, e.ns+".tenant-a-web").GetResourceVersion(),
		e.getCilium(ingress.L2PolicyGVK.Kind, e.ns+".tenant-a-web").GetResourceVersion(),
	}
}

// MatchFields matches a ServicePort's nodePort, name, port and targetPort.
func MatchFields(nodePort int32, name string, port int32, target intstr.IntOrString) OmegaMatcher {
	return And(
		WithTransform(func(p corev1.ServicePort) int32 { return p.NodePort }, Equal(nodePort)),
		WithTransform(func(p corev1.ServicePort) string { return p.Name }, Equal(name)),
		WithTransform(func(p corev1.ServicePort) int32 { return p.Port }, Equal(port)),
		WithTransform(func(p corev1.ServicePort) intstr.IntOrString { return p.TargetPort }, Equal(target)),
		WithTransform(func(p corev1.ServicePort) corev1.Protocol { return p.Protocol }, Equal(corev1.ProtocolTCP)),
	)
}

// ownedFields lists the leaf fields manager owns in obj, as dotted fieldsV1 paths.
func ownedFields(obj metav1.Object, manager string) []string {
	var out []string
	for _, m := range obj.GetManagedFields() {
		if m.Manager != manager || m.FieldsV1 == nil {
			continue
		}
		var tree map[string]any
		if err := json.Unmarshal(m.FieldsV1.GetRawBytes(), &tree); err != nil {
			return []string{"unreadable: " + err.Error()}
		}
		out = append(out, leaves("", tree)...)
	}
	slices.Sort(out)
	return out
}

func leaves(prefix string, tree map[string]any) []string {
	var out []string
	for k, v := range tree {
		if k == "." {
			continue
		}
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		sub, _ := v.(map[string]any)
		if len(sub) == 0 || (len(sub) == 1 && sub["."] != nil) {
			out = append(out, path)
			continue
		}
		out = append(out, leaves(path, sub)...)
	}
	return out
}

func managers(obj metav1.Object) []string {
	var out []string
	for _, m := range obj.GetManagedFields() {
		out = append(out, m.Manager)
	}
	return out
}

// --- counting clients -----------------------------------------------------------------------

// counters counts a client's reads and writes and remembers what was written.
type counters struct {
	reads, writes atomic.Int64
	mu            sync.Mutex
	written       []string
	last          time.Time
}

func (c *counters) wrote(what string, obj any) {
	c.writes.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.written = append(c.written, fmt.Sprintf("%s %T %v", what, obj, objectName(obj)))
	c.last = time.Now()
}

func (c *counters) log() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.written)
}

// writesSince counts the writes of the last d (a rough "still writing?").
func (c *counters) writesSince(d time.Duration) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.last) < d {
		return 1
	}
	return 0
}

func (c *counters) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads.Store(0)
	c.writes.Store(0)
	c.written = nil
}

func objectName(obj any) string {
	if o, ok := obj.(client.Object); ok {
		return client.ObjectKeyFromObject(o).String()
	}
	if ac, ok := obj.(interface{ GetName() *string }); ok {
		return ptr.Deref(ac.GetName(), "")
	}
	return ""
}

type countingClient struct {
	client.Client
	c *counters
}

func (c countingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.c.reads.Add(1)
	return c.Client.Get(ctx, key, obj, opts...)
}

func (c countingClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.c.wrote("create", obj)
	return c.Client.Create(ctx, obj, opts...)
}

func (c countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.c.wrote("update", obj)
	return c.Client.Update(ctx, obj, opts...)
}

func (c countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.c.wrote("patch", obj)
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c countingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	c.c.wrote("apply", obj)
	return c.Client.Apply(ctx, obj, opts...)
}

func (c countingClient) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	c.c.wrote("delete", obj)
	return c.Client.Delete(ctx, obj, opts...)
}

func (c countingClient) Status() client.SubResourceWriter {
	return countingStatus{SubResourceWriter: c.Client.Status(), c: c.c}
}

type countingStatus struct {
	client.SubResourceWriter
	c *counters
}

func (s countingStatus) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	s.c.wrote("status update", obj)
	return s.SubResourceWriter.Update(ctx, obj, opts...)
}

func (s countingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	s.c.wrote("status patch", obj)
	return s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// countingCache hands out guest clients that count.
type countingCache struct {
	clustercache.ClusterCache
	c *counters
}

func (cc countingCache) GetClient(ctx context.Context, cluster client.ObjectKey) (client.Client, error) {
	c, err := cc.ClusterCache.GetClient(ctx, cluster)
	if err != nil {
		return nil, err
	}
	return countingClient{Client: c, c: cc.c}, nil
}

// countingSetup registers the GuestIngress controller with host and guest clients that count.
func countingSetup(host, guest *counters) lab.SetupFunc {
	return func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, o manager.Options) error {
		return (&guestingress.Reconciler{
			Client:         countingClient{Client: mgr.GetClient(), c: host},
			APIReader:      mgr.GetAPIReader(),
			ClusterCache:   countingCache{ClusterCache: cc, c: guest},
			WatchNamespace: o.WatchNamespace,
		}).SetupWithManager(ctx, mgr, controller.Options{})
	}
}
