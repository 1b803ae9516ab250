package guestingress_test

// Lab tests of what guestnet does to the guest Service when more than one GuestIngress names
// it, when spec.guestService changes and when ports are dropped: one GuestIngress per guest
// Service, and the record gives back exactly what guestnet changed. Same lab and environment
// as guestingress_phases_lab_test.go.
//
// Run with: make test TEST_PKGS=./controllers/guestingress/... TEST_ARGS='-run GuestIngressGuestService -v'

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ownership"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
)

// Two GuestIngresses of one Cluster name the same guest Service with different ports. The
// older one owns it; the second is refused (GuestServiceClaimed, naming the first) and writes
// nothing: the guest Service stays as the first left it (no re-apply over each other, the
// record intact), and nothing exists on the host for the second. Once the first is deleted
// (giving the Service back), the second takes it, recording what the user had; its own
// deletion gives the Service back exactly.
func TestGuestIngressGuestService_OneGuestIngressPerGuestService(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	before := e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	first := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(first)
	owned := e.getGuestService()

	second := e.createGuestIngress("web-2", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.Ports = []guestnetv1.IngressPort{{Name: "https", Port: 443, NodePort: ptr.To(e.nodePort(5))}}
		gi.Spec.LoadBalancer.IP = e.ip(11)
	})
	c := e.eventuallyCondition(second, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServiceClaimedReason)
	e.g.Expect(c.Message).To(ContainSubstring("GuestIngress web of this namespace"))
	e.g.Expect(c.Message).To(ContainSubstring("Service %s/envoy", e.guestNS))
	e.g.Expect(e.getGuestIngress(second).Status.GuestService).To(BeNil())

	// Nothing is written to the guest Service: it stays as the first GuestIngress left it.
	e.g.Consistently(func() string { return e.getGuestService().ResourceVersion }).WithTimeout(3 * time.Second).Should(Equal(owned.ResourceVersion))
	e.g.Expect(e.getGuestService().Annotations[guestnetv1.OriginalGuestServiceAnnotation]).
		To(Equal(`{"type":"ClusterIP","nodePorts":[{"port":80,"protocol":"TCP"},{"port":443,"protocol":"TCP"}]}`))
	// Nor anything on the host.
	_, err := e.tryGetHostService("tenant-a-web-2")
	e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "host Service of the second: %v", err)
	for _, kind := range []string{ingress.PoolGVK.Kind, ingress.L2PolicyGVK.Kind} {
		_, err := e.tryGetCilium(kind, e.ns+".tenant-a-web-2")
		e.g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s of the second: %v", kind, err)
	}

	// The first goes: the second takes the Service, and records what the user had.
	e.g.Expect(e.host.Delete(e.ctx, first)).To(Succeed())
	e.eventuallyGone(first)
	got := e.eventuallyReady(second)
	e.g.Expect(got.Status.GuestService).To(Equal(&guestnetv1.ObjectReference{Namespace: e.guestNS, Name: "envoy"}))
	svc := e.getGuestService()
	e.g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeNodePort))
	e.g.Expect(svc.Spec.Ports[1].NodePort).To(Equal(e.nodePort(5)))
	e.g.Expect(svc.Annotations[guestnetv1.OriginalGuestServiceAnnotation]).To(Equal(`{"type":"ClusterIP","nodePorts":[{"port":443,"protocol":"TCP"}]}`))

	e.g.Expect(e.host.Delete(e.ctx, second)).To(Succeed())
	e.eventuallyGone(second)
	e.expectGivenBack("envoy", before)
}

// The owner stops being admitted (here: the test's own admission decision, by a label): it
// may hold nothing any more, so it gives the guest Service back, and the second GuestIngress,
// refused until then, takes it. Admitted again, the first is the owner again: the second
// gives the Service back and the first takes it; the record is what the user had each time.
func TestGuestIngressGuestService_AnOwnerThatMayHoldNothingGivesTheServiceBack(t *testing.T) {
	t.Parallel()
	const refuseLabel = "test.guestnet.dev/refuse"
	admit := func(in policy.Input) policy.Decision {
		if in.GuestIngress.Labels[refuseLabel] == "yes" {
			return policy.Decision{Reason: guestnetv1.NotAllowedReason, Message: "the test refuses it"}
		}
		return policy.Admit(in)
	}
	e := newPhaseEnv(t, envOptions{setup: admitSetup(admit)})
	before := e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	gc := e.createCluster("tenant-a", 1)
	first := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(first)
	second := e.createGuestIngress("web-2", gc.Name, func(gi *guestnetv1.GuestIngress) {
		gi.Spec.Ports = []guestnetv1.IngressPort{{Name: "https", Port: 443, NodePort: ptr.To(e.nodePort(5))}}
		gi.Spec.LoadBalancer.IP = e.ip(11)
	})
	e.eventuallyCondition(second, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServiceClaimedReason)

	setRefused := func(value string) {
		t.Helper()
		e.updateGuestIngress(first, func(gi *guestnetv1.GuestIngress) { gi.Labels = map[string]string{refuseLabel: value} })
	}
	setRefused("yes")
	e.eventuallyCondition(first, guestnetv1.AdmittedCondition, metav1.ConditionFalse, guestnetv1.NotAllowedReason)
	e.eventuallyReady(second)
	e.g.Eventually(func() *guestnetv1.ObjectReference { return e.getGuestIngress(first).Status.GuestService }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(BeNil(), "the first gave the Service back")
	svc := e.getGuestService()
	e.g.Expect(svc.Spec.Ports[1].NodePort).To(Equal(e.nodePort(5)))
	e.g.Expect(svc.Annotations[guestnetv1.OriginalGuestServiceAnnotation]).To(Equal(`{"type":"ClusterIP","nodePorts":[{"port":443,"protocol":"TCP"}]}`))

	setRefused("no")
	e.eventuallyCondition(second, guestnetv1.LoadBalancerReadyCondition, metav1.ConditionFalse, guestnetv1.GuestServiceClaimedReason)
	e.eventuallyReady(first)
	svc = e.getGuestService()
	e.g.Expect([]int32{svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort}).To(Equal([]int32{e.nodePort(0), e.nodePort(1)}))
	e.g.Expect(svc.Annotations[guestnetv1.OriginalGuestServiceAnnotation]).
		To(Equal(`{"type":"ClusterIP","nodePorts":[{"port":80,"protocol":"TCP"},{"port":443,"protocol":"TCP"}]}`))

	for _, gi := range []*guestnetv1.GuestIngress{second, first} {
		e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
		e.eventuallyGone(gi)
	}
	e.expectGivenBack("envoy", before)
}

// Changing spec.guestService gives the old guest Service back (restored and released, as at
// deletion) before the new one is taken: the new one gets the very nodePorts the old one
// held. Deleting the GuestIngress then gives the new one back and leaves the old one alone.
func TestGuestIngressGuestService_ChangingTheTargetGivesTheOldServiceBack(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	before := e.createGuestService(corev1.ServiceTypeClusterIP, nil)
	beforeNew := e.newGuestService(corev1.ServiceTypeClusterIP, nil)
	beforeNew.Name = "envoy-2"
	e.g.Expect(e.guest.Create(e.ctx, beforeNew, client.FieldOwner("helm"))).To(Succeed())
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)

	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.GuestService.Name = "envoy-2" })
	e.expectGivenBack("envoy", before)
	e.eventuallyConditionMessage(gi, guestnetv1.GuestServiceReadyCondition, metav1.ConditionTrue, guestnetv1.ReadyReason, "envoy-2")
	svc := e.getGuestServiceNamed("envoy-2")
	e.g.Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeNodePort))
	e.g.Expect([]int32{svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort}).To(Equal([]int32{e.nodePort(0), e.nodePort(1)}))
	e.g.Expect(svc.Annotations[guestnetv1.OriginalGuestServiceAnnotation]).
		To(Equal(`{"type":"ClusterIP","nodePorts":[{"port":80,"protocol":"TCP"},{"port":443,"protocol":"TCP"}]}`))
	e.g.Eventually(func() *guestnetv1.ObjectReference { return e.getGuestIngress(gi).Status.GuestService }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(Equal(&guestnetv1.ObjectReference{Namespace: e.guestNS, Name: "envoy-2"}))
	e.eventuallyReady(gi)

	e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
	e.eventuallyGone(gi)
	e.expectGivenBack("envoy-2", beforeNew)
	e.expectGivenBack("envoy", before)
}

// A NodePort guest Service with the user's own nodePorts, whose ports guestnet fixes to
// others. A port dropped from spec.ports gets the user's nodePort back at once, while the
// record keeps the other's; a port whose fixed nodePort is removed from the spec (guestnet
// then follows it) gets its own back too. The deletion then leaves the Service exactly as
// the user had it.
func TestGuestIngressGuestService_ADroppedPortGetsItsNodePortBack(t *testing.T) {
	t.Parallel()
	e := newPhaseEnv(t, envOptions{})
	before := e.createGuestService(corev1.ServiceTypeNodePort, []int32{e.nodePort(5), e.nodePort(6)})
	gc := e.createCluster("tenant-a", 1)
	gi := e.createGuestIngress("web", gc.Name)
	e.eventuallyReady(gi)
	e.g.Expect(e.getGuestService().Annotations[guestnetv1.OriginalGuestServiceAnnotation]).To(Equal(fmt.Sprintf(
		`{"nodePorts":[{"port":80,"protocol":"TCP","nodePort":%d},{"port":443,"protocol":"TCP","nodePort":%d}]}`, e.nodePort(5), e.nodePort(6))))

	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.Ports = gi.Spec.Ports[:1] })
	e.g.Eventually(func(g Gomega) {
		svc := e.getGuestService()
		g.Expect([]int32{svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort}).To(Equal([]int32{e.nodePort(0), e.nodePort(6)}))
		g.Expect(svc.Annotations[guestnetv1.OriginalGuestServiceAnnotation]).To(Equal(fmt.Sprintf(
			`{"nodePorts":[{"port":80,"protocol":"TCP","nodePort":%d}]}`, e.nodePort(5))))
		g.Expect(ownedFields(svc, ownership.FieldManager)).To(ConsistOf(
			"f:metadata.f:annotations.f:guestnet.addons.cluster.x-k8s.io/original",
			"f:spec.f:type",
			`f:spec.f:ports.k:{"port":80,"protocol":"TCP"}.f:nodePort`,
			`f:spec.f:ports.k:{"port":80,"protocol":"TCP"}.f:port`,
			`f:spec.f:ports.k:{"port":80,"protocol":"TCP"}.f:protocol`,
		))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	e.eventuallyReady(gi)

	e.updateGuestIngress(gi, func(gi *guestnetv1.GuestIngress) { gi.Spec.Ports[0].NodePort = nil })
	e.g.Eventually(func(g Gomega) {
		svc := e.getGuestService()
		g.Expect([]int32{svc.Spec.Ports[0].NodePort, svc.Spec.Ports[1].NodePort}).To(Equal([]int32{e.nodePort(5), e.nodePort(6)}))
		g.Expect(svc.Annotations).NotTo(HaveKey(guestnetv1.OriginalGuestServiceAnnotation))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
	e.g.Eventually(func() []guestnetv1.IngressPortStatus { return e.getGuestIngress(gi).Status.Ports }).
		WithTimeout(waitTimeout).WithPolling(poll).Should(Equal([]guestnetv1.IngressPortStatus{{Name: "http", Port: 80, NodePort: e.nodePort(5)}}))

	e.g.Expect(e.host.Delete(e.ctx, gi)).To(Succeed())
	e.eventuallyGone(gi)
	e.expectGivenBack("envoy", before)
}

func (e *phaseEnv) getGuestServiceNamed(name string) *corev1.Service {
	e.t.Helper()
	svc := &corev1.Service{}
	e.g.Expect(e.guest.Get(e.ctx, client.ObjectKey{Namespace: e.guestNS, Name: name}, svc)).To(Succeed())
	return svc
}

// expectGivenBack: the guest Service name is again as the user had it (before), and guestnet
// owns no field of it.
func (e *phaseEnv) expectGivenBack(name string, before *corev1.Service) {
	e.t.Helper()
	e.g.Eventually(func(g Gomega) {
		after := e.getGuestServiceNamed(name)
		g.Expect(after.Spec).To(Equal(before.Spec))
		g.Expect(after.Labels).To(Equal(before.Labels))
		g.Expect(after.Annotations).To(Equal(before.Annotations))
		g.Expect(managers(after)).NotTo(ContainElement(ownership.FieldManager))
	}).WithTimeout(waitTimeout).WithPolling(poll).Should(Succeed())
}
