package guestingresspolicy

import (
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
)

// The status lists what the policy admits in a stable order (an unchanged world writes the
// same status), bounded by the CRD's limit, with the full count.
func TestSetStatus(t *testing.T) {
	g := NewWithT(t)
	p := &guestnetv1.GuestIngressPolicy{Spec: guestnetv1.GuestIngressPolicySpec{
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "a"}},
	}}
	var admitted []guestnetv1.AdmittedGuestIngress
	for i := 40; i > 0; i-- {
		admitted = append(admitted, guestnetv1.AdmittedGuestIngress{Namespace: fmt.Sprintf("ns-%02d", i%3), Name: fmt.Sprintf("gi-%02d", i)})
	}
	setStatus(p, 3, admitted)
	g.Expect(p.Status.Selector).To(Equal("tenant=a"))
	g.Expect(p.Status.Namespaces).To(BeEquivalentTo(3))
	g.Expect(p.Status.AdmittedGuestIngresses).To(BeEquivalentTo(40))
	g.Expect(p.Status.GuestIngresses).To(HaveLen(maxListed))
	g.Expect(p.Status.GuestIngresses[0]).To(Equal(guestnetv1.AdmittedGuestIngress{Namespace: "ns-00", Name: "gi-03"}))
	g.Expect(p.Status.GuestIngresses[1]).To(Equal(guestnetv1.AdmittedGuestIngress{Namespace: "ns-00", Name: "gi-06"}))

	setStatus(p, 0, nil)
	g.Expect(p.Status.GuestIngresses).To(BeEmpty())
	g.Expect(p.Status.AdmittedGuestIngresses).To(BeZero())
}

func TestSetReadyCondition(t *testing.T) {
	g := NewWithT(t)
	p := &guestnetv1.GuestIngressPolicy{Spec: guestnetv1.GuestIngressPolicySpec{SharedPools: []string{"shared"}}}
	world := &policy.World{Pools: map[string]*unstructured.Unstructured{}}
	setReadyCondition(p, world)
	c := conditions.Get(p, guestnetv1.ReadyCondition)
	g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
	g.Expect(c.Reason).To(Equal(guestnetv1.SharedPoolNotFoundReason))

	p.Spec.SharedPools = nil
	setReadyCondition(p, world)
	g.Expect(conditions.IsTrue(p, guestnetv1.ReadyCondition)).To(BeTrue())
}

func TestSetHostAddressesOutsideCondition(t *testing.T) {
	g := NewWithT(t)
	p := &guestnetv1.GuestIngressPolicy{}
	setHostAddressesOutsideCondition(p, "")
	g.Expect(conditions.IsTrue(p, guestnetv1.HostAddressesOutsideCondition)).To(BeTrue())
	g.Expect(conditions.GetReason(p, guestnetv1.HostAddressesOutsideCondition)).To(Equal(guestnetv1.HostAddressesOutsideReason))

	setHostAddressesOutsideCondition(p, "10.244.0.1 (APIServer)")
	c := conditions.Get(p, guestnetv1.HostAddressesOutsideCondition)
	g.Expect(c.Status).To(BeEquivalentTo("False"))
	g.Expect(c.Reason).To(Equal(guestnetv1.CoversHostAddressesReason))
	g.Expect(c.Message).To(And(ContainSubstring("10.244.0.1 (APIServer)"), ContainSubstring("Narrow spec.addresses")))
}
