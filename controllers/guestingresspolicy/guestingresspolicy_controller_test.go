package guestingresspolicy

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// A GuestIngress's status write asks for no policy (each reconcile of a policy reads every
// GuestIngress); what admission reads does.
func TestPoliciesFollowWhatAdmissionReadsOfAGuestIngress(t *testing.T) {
	old := &guestnetv1.GuestIngress{ObjectMeta: metav1.ObjectMeta{Namespace: "k0smotron", Name: "web", Generation: 1, ResourceVersion: "1",
		Labels: map[string]string{"team": "a"}, Annotations: map[string]string{"note": "a"}}}
	tests := []struct {
		name   string
		change func(*guestnetv1.GuestIngress)
		want   bool
	}{
		{name: "status only", change: func(gi *guestnetv1.GuestIngress) { gi.Status.LoadBalancerIP = "10.2.6.220" }},
		{name: "spec (a new generation)", change: func(gi *guestnetv1.GuestIngress) { gi.Generation = 2 }, want: true},
		{name: "labels", change: func(gi *guestnetv1.GuestIngress) { gi.Labels = map[string]string{"team": "b"} }, want: true},
		{name: "annotations", change: func(gi *guestnetv1.GuestIngress) { gi.Annotations = nil }, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			updated := old.DeepCopy()
			updated.ResourceVersion = "2"
			tt.change(updated)
			NewWithT(t).Expect(notStatusOnly().Update(event.UpdateEvent{ObjectOld: old, ObjectNew: updated})).To(Equal(tt.want))
		})
	}
	g := NewWithT(t)
	g.Expect(notStatusOnly().Create(event.CreateEvent{Object: old})).To(BeTrue())
	g.Expect(notStatusOnly().Delete(event.DeleteEvent{Object: old})).To(BeTrue())
}
