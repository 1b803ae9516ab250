package guestingress_test

// Lab tests of the GuestIngress invariants (docs/guestingress.md#invariants): a working
// GuestIngress is never displaced, a claim that cannot hold host objects blocks nobody, an
// admin's pool is never disabled, nothing is created for a GuestIngress its policy does not
// admit, the guest Service is handed back exactly, finalizers end, and input the apiserver
// could not check becomes a condition. Same lab and environment as guestingress_phases_lab_test.go.
//
// Run with: make test TEST_PKGS=./controllers/guestingress/... TEST_ARGS='-run GuestIngressInvariants -v'

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/controllers/guestingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/e2e/lab"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/manager"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
)

// GuestIngresses that cannot hold host objects claim nothing: an older one whose Cluster does
// not exist, and an older one whose Cluster is paused, do not keep a younger one from the IP
// they ask for.
func TestGuestIngressInvariants_AClaimThatCannotHoldHostObjectsBlocksNobody(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	orphan := e.createGuestIngress("orphan", "no-such-cluster")
	e.eventuallyCondition(orphan, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotFoundReason)
	other := e.createCluster("other", 1)
	paused := e.createGuestIngress("paused", other.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	})
	e.eventuallyCondition(paused, guestnetv1.PausedCondition, metav1.ConditionTrue, guestnetv1.PausedReason)
	time.Sleep(1100 * time.Millisecond) // creationTimestamps have a resolution of a second

	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	got := e.eventuallyReady(gi)
	e.g.Expect(got.Status.LoadBalancerIP).To(Equal(e.ip(10)))
}

// A GuestIngress that holds its IP on the host keeps it: not a status that loses the IP, not
// the tenant deleting the host Service, not a class change that replaces the Service's class,
// lets an older GuestIngress that asks for the same IP take it. It goes to the older one when
// the holder is deleted.
func TestGuestIngressInvariants_AHolderIsNeverDisplaced(t *testing.T) {
	t.Parallel()
	first := newPhaseEnv(t, envOptions{allNamespaces: true})
	second := first.sibling(t)
	first.createGuestService(corev1.ServiceTypeClusterIP, nil)
	second.createGuestService(corev1.ServiceTypeClusterIP, nil)

	// The older one: its Cluster does not exist yet, so it claims nothing.
	older := second.createGuestIngress("web", "tenant-b", func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.IP = first.ip(10) })
	second.eventuallyCondition(older, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.ClusterNotFoundReason)
	time.Sleep(1100 * time.Millisecond)
	gcA := first.createCluster("tenant-a", 1)
	holder := first.createGuestIngress("web", gcA.Name)
	first.eventuallyReady(holder)
	pool := first.getCilium(ingress.PoolGVK.Kind, first.ns+".tenant-a-web")

	// The older one's Cluster appears: it is refused, naming the holder.
	second.createCluster("tenant-b", 1)
	c := second.eventuallyCondition(older, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.IPConflictReason)
	second.g.Expect(c.Message).To(ContainSubstring("IP %s is already claimed by another namespace's GuestIngress (it holds them on the host)", first.ip(10)))
	keeps := func(what string) {
		t.Helper()
		second.g.Consistently(func(g Gomega) {
			g.Expect(conditions.GetReason(second.getGuestIngress(older), guestnetv1.LoadBalancerReadyCondition)).To(Equal(guestnetv1.IPConflictReason))
			_, err := second.tryGetCilium(ingress.PoolGVK.Kind, second.ns+".tenant-b-web")
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the older one got a pool")
			g.Expect(first.getCilium(ingress.PoolGVK.Kind, first.ns+".tenant-a-web").GetUID()).To(Equal(pool.GetUID()), "the holder's pool was replaced")
		}).WithTimeout(2*time.Second).WithPolling(poll).Should(Succeed(), "after %s", what)
		first.eventuallyReady(holder)
	}

	// The tenant deletes the host Service: guestnet creates it again, the IP stays the holder's.
	svc := first.getHostService("tenant-a-web")
	first.g.Expect(first.host.Delete(first.ctx, svc)).To(Succeed())
	first.g.Eventually(func() types.UID { s, _ := first.tryGetHostService("tenant-a-web"); return s.UID }).
		WithTimeout(waitTimeout).WithPolling(poll).ShouldNot(Or(BeEmpty(), Equal(svc.UID)))
	keeps("the host Service was deleted")

	// The status loses the IP (Cilium re-allocating, a status patch not in the cache yet).
	first.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		got := first.getGuestIngress(holder)
		got.Status.LoadBalancerIP = ""
		got.Status.Conditions = nil
		return first.host.Status().Update(first.ctx, got)
	})).To(Succeed())
	keeps("the status lost the IP")

	// A class change: the Service's class cannot change in place; the Service (and its
	// request for the IP) stays while the class changes.
	svc = first.getHostService("tenant-a-web")
	first.updateGuestIngress(holder, func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.Class = "io.cilium/bgp-control-plane" })
	first.g.Eventually(func() *string { return first.getHostService("tenant-a-web").Spec.LoadBalancerClass }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(Equal(ptr.To("io.cilium/bgp-control-plane")))
	first.g.Expect(first.getHostService("tenant-a-web").UID).To(Equal(svc.UID), "the host Service was replaced")
	keeps("the class changed")

	// The holder goes: the older one takes the IP over.
	first.g.Expect(first.host.Delete(first.ctx, holder)).To(Succeed())
	got := second.eventuallyReady(older)
	second.g.Expect(got.Status.LoadBalancerIP).To(Equal(first.ip(10)))
}

// A pool that guestnet does not manage (an admin's) is never overlapped: Cilium would disable
// the newer of two overlapping pools, and either one when they were created in the same second.
// The GuestIngress is refused up front, naming the pool, and gets no pool of its own.
func TestGuestIngressInvariants_AnAdminPoolIsNeverDisabled(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	adminPool := ingress.NewPool()
	adminPool.SetName("admin-" + e.ns)
	adminPool.Object["spec"] = map[string]any{
		"blocks":          []any{map[string]any{"start": e.lbNet + ".64", "stop": e.lbNet + ".95"}},
		"serviceSelector": map[string]any{"matchLabels": map[string]any{"example.com/pool": "admin"}},
	}
	e.g.Expect(e.host.Create(e.ctx, adminPool)).To(Succeed())
	t.Cleanup(func() { _ = e.host.Delete(context.Background(), adminPool) })

	gi := e.createGuestIngress("web", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.IP = ""
		gi.Spec.LoadBalancer.CIDRs = []string{e.lbNet + ".88/29"}
	})
	c := e.eventuallyCondition(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.PoolConflictReason)
	e.g.Expect(c.Message).To(ContainSubstring("The pool ranges %s.88/29 are in a pool of the platform", e.lbNet))
	e.g.Expect(c.Message).NotTo(ContainSubstring("admin-"+e.ns), "the platform's pools are not named to the tenant")
	e.g.Consistently(func() error { _, err := e.tryGetCilium(ingress.PoolGVK.Kind, e.ns+".tenant-a-web"); return err }).
		WithTimeout(2 * time.Second).Should(Satisfy(apierrors.IsNotFound))
	e.g.Expect(conditions.Get(e.getGuestIngress(gi), guestnetv1.ReadyCondition).Reason).To(Equal(guestnetv1.PoolConflictReason))

	// Ranges outside the admin's pool: it works.
	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.CIDRs = []string{e.lbNet + ".96/29"} })
	e.eventuallyReady(gi)
}

// A GuestIngress its policy does not admit gets nothing on the host: what it had is deleted
// (Warning events), Ready is False with the reason and message of Admitted. A change of the
// namespace's labels or of the GuestIngressPolicies decides again, without a resync. (The
// decision is the test's own, through Reconciler.Admit; internal/policy has its own tests.)
func TestGuestIngressInvariants_NotAdmittedGetsNothingOnTheHost(t *testing.T) {
	t.Parallel()
	var policyNameValue atomic.Value // set once the namespace is known
	policyName := func() string { name, _ := policyNameValue.Load().(string); return name }
	const admitLabel = "test.guestnet.dev/admit"
	admit := func(in policy.Input) policy.Decision {
		if in.Namespace == nil || in.Namespace.Labels[admitLabel] != "yes" {
			return policy.Decision{Reason: guestnetv1.NotAllowedReason,
				Message: fmt.Sprintf("namespace %s lacks the label %s=yes that GuestIngressPolicy %s requires", in.GuestIngress.Namespace, admitLabel, policyName())}
		}
		for _, p := range in.Policies {
			if p.Name == policyName() {
				return policy.Admit(in)
			}
		}
		return policy.Decision{Reason: guestnetv1.NoPolicyReason, Message: "no GuestIngressPolicy selects namespace " + in.GuestIngress.Namespace}
	}
	e := newPhaseEnv(t, envOptions{setup: admitSetup(admit)})
	policyNameValue.Store("test-" + e.ns)
	setLabel := func(value string) {
		t.Helper()
		e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ns := &corev1.Namespace{}
			if err := e.host.Get(e.ctx, client.ObjectKey{Name: e.ns}, ns); err != nil {
				return err
			}
			if ns.Labels == nil {
				ns.Labels = map[string]string{}
			}
			ns.Labels[admitLabel] = value
			return e.host.Update(e.ctx, ns)
		})).To(Succeed())
	}
	createPolicy := func() *guestnetv1.GuestIngressPolicy {
		t.Helper()
		p := &guestnetv1.GuestIngressPolicy{ObjectMeta: metav1.ObjectMeta{Name: policyName()}}
		e.g.Expect(e.host.Create(e.ctx, p)).To(Succeed())
		t.Cleanup(func() { _ = e.host.Delete(context.Background(), p) })
		return p
	}
	setLabel("yes")
	p := createPolicy()
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	got := e.eventuallyReady(gi)
	e.g.Expect(conditions.GetReason(got, guestnetv1.AdmittedCondition)).To(Equal(guestnetv1.AdmittedReason))

	nothingOnTheHost := func(reason, message string) {
		t.Helper()
		c := e.eventuallyCondition(gi, guestnetv1.AdmittedCondition, metav1.ConditionFalse, reason)
		e.g.Expect(c.Message).To(ContainSubstring(message))
		ready := e.eventuallyCondition(gi, guestnetv1.ReadyCondition, metav1.ConditionFalse, reason)
		e.g.Expect(ready.Message).To(ContainSubstring(message))
		e.g.Eventually(func(g Gomega) {
			_, err := e.tryGetHostService("tenant-a-web")
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "host Service")
			for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
				_, err := e.tryGetCilium(kind, e.ns+".tenant-a-web")
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), kind)
			}
			got := e.getGuestIngress(gi)
			g.Expect(got.Status.LoadBalancerIP).To(BeEmpty())
			g.Expect(got.Status.HostService).To(BeEmpty())
		}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	}

	// The namespace loses the label the policy selects.
	setLabel("no")
	nothingOnTheHost(guestnetv1.NotAllowedReason, "lacks the label "+admitLabel+"=yes")
	e.eventuallyEvent(e.getGuestIngress(gi).UID, corev1.EventTypeWarning, guestnetv1.NotAllowedReason, "Deleted")
	setLabel("yes")
	e.eventuallyReady(gi)

	// The policy goes.
	e.g.Expect(e.host.Delete(e.ctx, p)).To(Succeed())
	nothingOnTheHost(guestnetv1.NoPolicyReason, "no GuestIngressPolicy selects namespace "+e.ns)
	createPolicy()
	e.eventuallyReady(gi)
}

// A LoadBalancer guest Service without nodePorts (allocateLoadBalancerNodePorts: false) is not
// made NodePort: that would drop its loadBalancerClass and release the guest's own
// load-balancer IP. guestnet refuses and says what to change; the Service stays as it is.
func TestGuestIngressInvariants_ALoadBalancerWithoutNodePortsIsNotChanged(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	svc := e.newGuestService(corev1.ServiceTypeLoadBalancer, nil)
	svc.Spec.LoadBalancerClass = ptr.To("example.com/guest-lb")
	svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	e.g.Expect(e.guest.Create(e.ctx, svc, client.FieldOwner("helm"))).To(Succeed())
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)

	c := e.eventuallyCondition(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionFalse, guestnetv1.NoNodePortsReason)
	e.g.Expect(c.Message).To(ContainSubstring("allocateLoadBalancerNodePorts"))
	e.g.Consistently(func(g Gomega) {
		now := e.getGuestService()
		g.Expect(now.ResourceVersion).To(Equal(svc.ResourceVersion), "the guest Service was changed")
		_, err := e.tryGetHostService("tenant-a-web")
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "a host Service forwarding to nodePorts the guest does not have")
	}).WithTimeout(2 * time.Second).WithPolling(poll).Should(Succeed())
	e.g.Expect(conditions.GetReason(e.getGuestIngress(gi), guestnetv1.ReadyCondition)).To(Equal(guestnetv1.NoNodePortsReason))

	// The user lets the Service allocate nodePorts: guestnet carries on (the type stays).
	e.g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		now := e.getGuestService()
		now.Spec.AllocateLoadBalancerNodePorts = ptr.To(true)
		return e.guest.Update(e.ctx, now, client.FieldOwner("helm"))
	})).To(Succeed())
	e.eventuallyReady(gi)
	now := e.getGuestService()
	e.g.Expect(now.Spec.Type).To(Equal(corev1.ServiceTypeLoadBalancer))
	e.g.Expect(now.Spec.LoadBalancerClass).To(Equal(ptr.To("example.com/guest-lb")))
}

// Deleting the GuestIngress hands the guest Service back exactly as the user had it: type,
// loadBalancerClass, allocateLoadBalancerNodePorts and nodePorts, whatever guestnet changed.
func TestGuestIngressInvariants_DeletionHandsTheGuestServiceBackExactly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		create func(e *phaseEnv) *corev1.Service
		fixed  bool // the GuestIngress fixes nodePort(0) and nodePort(1)
	}{
		{
			name:   "ClusterIP made NodePort",
			create: func(e *phaseEnv) *corev1.Service { return e.newGuestService(corev1.ServiceTypeClusterIP, nil) },
			fixed:  true,
		},
		{
			name: "NodePort with the user's nodePorts, guestnet fixing others",
			create: func(e *phaseEnv) *corev1.Service {
				return e.newGuestService(corev1.ServiceTypeNodePort, []int32{e.nodePort(5), e.nodePort(6)})
			},
			fixed: true,
		},
		{
			name: "NodePort whose nodePorts guestnet follows",
			create: func(e *phaseEnv) *corev1.Service {
				return e.newGuestService(corev1.ServiceTypeNodePort, []int32{e.nodePort(5), e.nodePort(6)})
			},
		},
		{
			name: "LoadBalancer of another class with the user's nodePorts, guestnet fixing others",
			create: func(e *phaseEnv) *corev1.Service {
				svc := e.newGuestService(corev1.ServiceTypeLoadBalancer, []int32{e.nodePort(5), e.nodePort(6)})
				svc.Spec.LoadBalancerClass = ptr.To("example.com/guest-lb")
				svc.Spec.AllocateLoadBalancerNodePorts = ptr.To(true)
				return svc
			},
			fixed: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newPhaseEnv(t, envOptions{})
			before := tt.create(e)
			e.g.Expect(e.guest.Create(e.ctx, before, client.FieldOwner("helm"))).To(Succeed())
			gc := e.createCluster("tenant-a", 1)
			gi := e.createGuestIngress("web", gc.Name, func(gi *guestnetv1.GuestIngress) {
				if !tt.fixed {
					gi.Spec.Ports[0].NodePort, gi.Spec.Ports[1].NodePort = nil, nil
				}
			})
			e.eventuallyReady(gi)
			if tt.fixed {
				e.g.Expect(e.getGuestService().Spec.Ports[0].NodePort).To(Equal(e.nodePort(0)))
			}

			e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
			e.eventuallyGone(gi)
			after := e.getGuestService()
			e.g.Expect(after.Spec).To(Equal(before.Spec))
			e.g.Expect(after.Labels).To(Equal(before.Labels))
			e.g.Expect(after.Annotations).To(Equal(before.Annotations))
			e.g.Expect(managers(after)).NotTo(ContainElement(ownership.FieldManager))
		})
	}
}

// A deleted GuestIngress whose guest is gone for good (here: the <cluster>-kubeconfig Secret
// was deleted, and a restarted manager cannot reach the guest) does not wait for it: the host
// objects are deleted, the finalizer released, and a Warning event says what was left in the
// guest.
func TestGuestIngressInvariants_FinalizerEndsWhenTheGuestIsGone(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{manual: true})
	stop := e.runManager(setupGuestIngress)
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	uid := e.eventuallyReady(gi).UID
	e.g.Expect(stop()).To(Succeed())

	e.g.Expect(e.host.Delete(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: gc.Name + "-kubeconfig"}})).To(Succeed())
	e.runManager(setupGuestIngress)
	e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
	e.eventuallyGone(gi)
	_, err := e.tryGetHostService("tenant-a-web")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue())
	for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
		_, err := e.tryGetCilium(kind, e.ns+".tenant-a-web")
		e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s left behind", kind)
	}
	ev := e.eventuallyEvent(uid, corev1.EventTypeWarning, guestnetv1.GuestGoneReason, "")
	e.g.Expect(ev.Note).To(ContainSubstring("Secret %s/tenant-a-kubeconfig", e.ns))
	e.g.Expect(ev.Note).To(ContainSubstring("Service %s/envoy", e.guestNS))
}

// A deleted GuestIngress whose guest cannot be reached waits (Ready says so, and how to give
// up); the skip-guest-cleanup annotation gives up on the guest: the finalizer is released and
// a Warning event says what was left there.
func TestGuestIngressInvariants_SkipGuestCleanupGivesUpOnAnUnreachableGuest(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createUnreachableCluster("tenant-a")
	gi := e.createGuestIngress("web", "tenant-a")
	e.eventuallyCondition(gi, guestnetv1.ClusterAvailableCondition, metav1.ConditionFalse, guestnetv1.GuestUnreachableReason)
	uid := e.getGuestIngress(gi).UID

	e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
	ready := e.eventuallyCondition(gi, guestnetv1.ReadyCondition, metav1.ConditionFalse, guestnetv1.DeletingReason)
	e.g.Expect(ready.Message).To(ContainSubstring(guestnetv1.SkipGuestCleanupAnnotation))
	e.g.Consistently(func() error { return e.host.Get(e.ctx, client.ObjectKeyFromObject(gi), &guestnetv1.GuestIngress{}) }).
		WithTimeout(2*time.Second).Should(Succeed(), "the finalizer went while the guest could still come back")

	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) {
		gi.Annotations = map[string]string{guestnetv1.SkipGuestCleanupAnnotation: "true"}
	})
	e.eventuallyGone(gi)
	ev := e.eventuallyEvent(uid, corev1.EventTypeWarning, guestnetv1.GuestGoneReason, "")
	e.g.Expect(ev.Note).To(ContainSubstring(guestnetv1.SkipGuestCleanupAnnotation))
	e.g.Expect(ev.Note).To(ContainSubstring("Service %s/envoy", e.guestNS))
}

// Values admission cannot check are a condition, not a reconcile error. An l2 interface that is
// no regular expression cannot be on any policy's list (a policy's interfaces are checked), so
// the policy refuses it first: Admitted says so and nothing is created on the host. A label
// value the apiserver would refuse makes LoadBalancerReady and Ready say what is wrong for the
// current generation, and nothing on the host changes until it is corrected.
func TestGuestIngressInvariants_InputAdmissionCannotCheckIsACondition(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.LoadBalancer.L2 = &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^eth[0-9+$"}}
	})
	c := e.eventuallyConditionMessage(gi, guestnetv1.AdmittedCondition, metav1.ConditionFalse, guestnetv1.NotAllowedReason, "^eth[0-9+$")
	e.g.Expect(c.Message).To(ContainSubstring("GuestIngressPolicy " + lab.LabPolicyName))
	got := e.eventuallyObserved(gi)
	e.g.Expect(conditions.GetReason(got, guestnetv1.ReadyCondition)).To(Equal(guestnetv1.NotAllowedReason))
	for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
		_, err := e.tryGetCilium(kind, e.ns+".tenant-a-web")
		e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), kind)
	}
	_, err := e.tryGetHostService("tenant-a-web")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "host Service")

	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.L2.Interfaces = []string{"^eth0$"} })
	e.eventuallyReady(gi)
	rv := e.getHostService("tenant-a-web").ResourceVersion

	const key = "test.guestnet.dev/team" // a key the lab's policy lets through
	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.Labels = map[string]string{key: "web edge"} })
	c = e.eventuallyConditionMessage(gi, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.InvalidSpecReason, "spec.loadBalancer.labels["+key+"]")
	e.g.Expect(c.Message).To(ContainSubstring("web edge"))
	got = e.eventuallyObserved(gi)
	e.g.Expect(conditions.GetReason(got, guestnetv1.ReadyCondition)).To(Equal(guestnetv1.InvalidSpecReason))
	e.g.Expect(e.getHostService("tenant-a-web").ResourceVersion).To(Equal(rv), "the host Service changed")
	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.LoadBalancer.Labels = map[string]string{key: "web-edge"} })
	e.eventuallyReady(gi)
}

// --- helpers --------------------------------------------------------------------------------

// unreachableEndpoint is a lab address nothing listens on (10.244.0.0/16 is local in the
// lab's network namespace: a connection is refused at once).
var unreachableEndpoint = clusterv1.APIEndpoint{Host: "10.244.0.254", Port: 1}

// createUnreachableCluster creates a provisioned Cluster whose control plane endpoint, and
// the server of its <cluster>-kubeconfig Secret, is an address nothing listens on: the
// ClusterCache never connects.
func (e *phaseEnv) createUnreachableCluster(name string) {
	e.t.Helper()
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name, Labels: e.labels()},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneEndpoint: unreachableEndpoint,
			ControlPlaneRef:      clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "K0smotronControlPlane", Name: name},
			InfrastructureRef:    clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "KubevirtCluster", Name: name},
		},
	}
	e.g.Expect(e.host.Create(e.ctx, cluster)).To(Succeed())
	cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	e.g.Expect(e.host.Status().Update(e.ctx, cluster)).To(Succeed())
	cfg, err := clientcmd.Load(e.l.Guest.Kubeconfig)
	e.g.Expect(err).NotTo(HaveOccurred())
	for _, c := range cfg.Clusters {
		c.Server = "https://" + unreachableEndpoint.String()
	}
	kubeconfig, err := clientcmd.Write(*cfg)
	e.g.Expect(err).NotTo(HaveOccurred())
	e.g.Expect(e.host.Create(e.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name + "-kubeconfig", Labels: map[string]string{clusterv1.ClusterNameLabel: name}},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": kubeconfig},
	})).To(Succeed())
}

// runManager starts a manager for the test's namespace that the test can stop (and start
// again); it is stopped at the end of the test if it still runs.
func (e *phaseEnv) runManager(setup lab.SetupFunc) (stop func() error) {
	e.t.Helper()
	e.managers++
	logPath := filepath.Join(e.l.Dir, fmt.Sprintf("manager-%s-%d.log", strings.ReplaceAll(e.t.Name(), "/", "_"), e.managers))
	logFile, err := os.Create(logPath)
	e.g.Expect(err).NotTo(HaveOccurred())
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(4)))
	_, stopManager, err := lab.RunManager(e.ctx, e.l, manager.Options{WatchNamespace: e.ns}, setup, logger)
	e.g.Expect(err).NotTo(HaveOccurred())
	var once sync.Once
	var stopErr error
	stop = func() error {
		once.Do(func() { stopErr = stopManager(); _ = logFile.Close() })
		return stopErr
	}
	e.t.Cleanup(func() {
		_ = stop()
		if e.t.Failed() {
			data, _ := os.ReadFile(logPath)
			if len(data) > 6000 {
				data = data[len(data)-6000:]
			}
			e.t.Logf("manager log %s, last lines:\n%s", logPath, data)
		}
	})
	return stop
}

// eventuallyEvent waits for an events.k8s.io Event about the object with that UID, of that
// type and reason, whose note starts with notePrefix, and returns it.
func (e *phaseEnv) eventuallyEvent(uid types.UID, eventType, reason, notePrefix string) eventsv1.Event {
	e.t.Helper()
	var found eventsv1.Event
	e.g.Eventually(func(g Gomega) {
		list := &eventsv1.EventList{}
		g.Expect(e.host.List(e.ctx, list, client.InNamespace(e.ns))).To(Succeed())
		var seen []string
		for _, ev := range list.Items {
			if ev.Regarding.UID != uid {
				continue
			}
			seen = append(seen, ev.Type+" "+ev.Reason+": "+ev.Note)
			if ev.Type == eventType && ev.Reason == reason && strings.HasPrefix(ev.Note, notePrefix) {
				found = ev
				return
			}
		}
		g.Expect(seen).To(ContainElement(HavePrefix(eventType+" "+reason+": "+notePrefix)), "events of the object")
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	return found
}

// eventuallyObserved waits until status.observedGeneration is the GuestIngress's generation.
func (e *phaseEnv) eventuallyObserved(gi *guestnetv1.GuestIngress) *guestnetv1.GuestIngress {
	e.t.Helper()
	var got *guestnetv1.GuestIngress
	e.g.Eventually(func(g Gomega) {
		got = e.getGuestIngress(gi)
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	return got
}

// admitSetup registers the GuestIngress controller with the test's admission decision.
func admitSetup(admit func(policy.Input) policy.Decision) lab.SetupFunc {
	return func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, o manager.Options) error {
		return (&guestingress.Reconciler{
			Client:           mgr.GetClient(),
			APIReader:        mgr.GetAPIReader(),
			ClusterCache:     cc,
			WatchFilterValue: o.WatchFilterValue,
			WatchNamespace:   o.WatchNamespace,
			Admit:            admit,
		}).SetupWithManager(ctx, mgr, controller.Options{})
	}
}
