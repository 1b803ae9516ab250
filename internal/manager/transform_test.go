package manager

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The caches keep guestnet's own server-side apply entries (so it can tell an apply that
// would change nothing) and drop everyone else's.
func TestKeepOwnManagedFields(t *testing.T) {
	g := NewWithT(t)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{
		{Manager: "helm", Operation: metav1.ManagedFieldsOperationUpdate},
		{Manager: "guestnet", Operation: metav1.ManagedFieldsOperationApply},
		{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"},
	}}}

	out, err := KeepOwnManagedFields(svc)

	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out.(*corev1.Service).ManagedFields).To(Equal([]metav1.ManagedFieldsEntry{
		{Manager: "guestnet", Operation: metav1.ManagedFieldsOperationApply},
	}))
	// Not an object: passed through.
	g.Expect(KeepOwnManagedFields("tombstone")).To(Equal("tombstone"))
}
