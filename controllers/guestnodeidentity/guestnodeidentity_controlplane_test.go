package guestnodeidentity

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
)

func TestSetControlPlaneAddressCondition(t *testing.T) {
	admitted := policy.Decision{Admitted: true, Policy: "tenants", Reason: guestnetv1.AdmittedReason}
	for name, tc := range map[string]struct {
		rep        controlPlaneReport
		wantStatus metav1.ConditionStatus
		wantReason string
		wantIn     string
	}{
		"refused by the policy": {rep: controlPlaneReport{decision: policy.Decision{Reason: guestnetv1.HostAddressReason, Message: "refused: ask"}},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.HostAddressReason, wantIn: "refused: ask"},
		"no Service": {rep: controlPlaneReport{decision: admitted, noService: "Service k0smotron/kmc-a-lb does not exist (yet). k0smotron creates",
			noServiceReason: guestnetv1.ControlPlaneServiceNotFoundReason},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.ControlPlaneServiceNotFoundReason, wantIn: "k0smotron creates"},
		"Cilium is not installed": {rep: controlPlaneReport{decision: admitted, conflict: "the host does not serve CiliumLoadBalancerIPPool: install Cilium", noCilium: true},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.CiliumLBIPAMNotInstalledReason, wantIn: "install Cilium"},
		"a pool of the name is someone else's": {rep: controlPlaneReport{decision: admitted, conflict: "CiliumLoadBalancerIPPool x exists"},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.HostObjectConflictReason, wantIn: "exists"},
		"Cilium reports a pool conflict": {rep: controlPlaneReport{decision: admitted, service: "kmc-a-lb", poolConflict: &metav1.Condition{Message: "overlaps web"}},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.PoolConflictReason, wantIn: "overlaps web"},
		"no IP yet": {rep: controlPlaneReport{decision: admitted, service: "kmc-a-lb", ipam: &metav1.Condition{Status: metav1.ConditionFalse, Reason: "no_pool", Message: "none"}},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.IPPendingReason, wantIn: "cilium.io/IPAMRequestSatisfied=False"},
		"another IP": {rep: controlPlaneReport{decision: admitted, service: "kmc-a-lb", ip: "10.2.6.1"},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.IPPendingReason, wantIn: "(it has 10.2.6.1)"},
		"the endpoint was set before": {rep: controlPlaneReport{decision: admitted, service: "kmc-a-lb", ip: "10.2.6.221", endpoint: "10.244.0.9"},
			wantStatus: metav1.ConditionFalse, wantReason: guestnetv1.ControlPlaneEndpointElsewhereReason, wantIn: "the workers join at 10.244.0.9"},
		"ready, the endpoint to come": {rep: controlPlaneReport{decision: admitted, service: "kmc-a-lb", ip: "10.2.6.221"},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.ControlPlaneAddressReadyReason, wantIn: "makes it the Cluster's endpoint"},
		"ready": {rep: controlPlaneReport{decision: admitted, service: "kmc-a-lb", ip: "10.2.6.221", endpoint: "10.2.6.221"},
			wantStatus: metav1.ConditionTrue, wantReason: guestnetv1.ControlPlaneAddressReadyReason, wantIn: "GuestIngressPolicy tenants admits it"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			gni := &guestnetv1.GuestNodeIdentity{Spec: guestnetv1.GuestNodeIdentitySpec{ControlPlane: &guestnetv1.ControlPlaneAddressSpec{IP: "10.2.6.221"}}}
			setControlPlaneAddressCondition(gni, tc.rep)
			c := conditions.Get(gni, guestnetv1.ControlPlaneAddressCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(tc.wantStatus))
			g.Expect(c.Reason).To(Equal(tc.wantReason))
			g.Expect(c.Message).To(ContainSubstring(tc.wantIn))
		})
	}
}

// Ready waits for the control plane address only when one is asked for.
func TestReadySummarisesTheControlPlaneAddressOnlyWhenAsked(t *testing.T) {
	g := NewWithT(t)
	gni := &guestnetv1.GuestNodeIdentity{}
	for _, c := range readyConditions {
		conditions.Set(gni, metav1.Condition{Type: c, Status: metav1.ConditionTrue, Reason: "Fine"})
	}
	setReadyCondition(gni)
	g.Expect(conditions.IsTrue(gni, guestnetv1.ReadyCondition)).To(BeTrue())
	gni.Spec.ControlPlane = &guestnetv1.ControlPlaneAddressSpec{IP: "10.2.6.221"}
	setReadyCondition(gni)
	g.Expect(conditions.IsTrue(gni, guestnetv1.ReadyCondition)).To(BeFalse())
	conditions.Set(gni, metav1.Condition{Type: guestnetv1.ControlPlaneAddressCondition, Status: metav1.ConditionFalse, Reason: guestnetv1.IPPendingReason})
	setReadyCondition(gni)
	g.Expect(conditions.GetReason(gni, guestnetv1.ReadyCondition)).To(Equal(guestnetv1.IPPendingReason))
}
