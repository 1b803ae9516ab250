package guestingress

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/optional"
)

// Without Cilium's CRDs a GuestIngress reads and writes nothing, and says what to install:
// Ready and LoadBalancerReady are False with CiliumLBIPAMNotInstalled.
func TestReconcileNormalWithoutCilium(t *testing.T) {
	g := NewWithT(t)
	r := newFakeReconciler(t)
	r.Cilium = optional.NewGate(optional.CiliumLBIPAM, meta.NewDefaultRESTMapper(nil), 0)
	gi := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"}}
	s := &scope{guestIngress: gi}

	_, err := r.reconcileNormal(context.Background(), s)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(s.observed).To(BeNil(), "nothing is observed")
	updateStatus(s)

	for _, typ := range []string{guestnetv1.LoadBalancerReadyCondition, guestnetv1.ReadyCondition} {
		c := conditions.Get(gi, typ)
		g.Expect(c).NotTo(BeNil(), typ)
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse), typ)
		g.Expect(c.Reason).To(Equal(guestnetv1.CiliumLBIPAMNotInstalledReason), typ)
		g.Expect(c.Message).To(And(ContainSubstring("CiliumLoadBalancerIPPool"), ContainSubstring("install Cilium"),
			ContainSubstring("without a restart")), typ)
	}
}
