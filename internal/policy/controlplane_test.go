package policy

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

func controlPlaneGNI(ip string, l2 *guestnetv1.L2AnnouncementSpec) *guestnetv1.GuestNodeIdentity {
	return &guestnetv1.GuestNodeIdentity{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "guest-1", UID: "uid-gni", CreationTimestamp: metav1.NewTime(created)},
		Spec: guestnetv1.GuestNodeIdentitySpec{ClusterName: "guest-1",
			ControlPlane: &guestnetv1.ControlPlaneAddressSpec{IP: ip, L2: l2}},
	}
}

// Issue 19, property 3: a control plane address is admitted exactly as a GuestIngress's IP,
// by the same policies, and never a host address; it takes no room under the per-namespace cap.
func TestAdmitControlPlane(t *testing.T) {
	tenantA := namespace("tenant-a", map[string]string{"tenant": "a"})
	l2 := &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^eth0$"}}
	tests := []struct {
		name       string
		gni        *guestnetv1.GuestNodeIdentity
		ns         map[string]string
		policy     func(*guestnetv1.GuestIngressPolicy)
		wantReason string // "" when admitted
		wantIn     []string
	}{
		{name: "an address of the policy, announced where it allows", gni: controlPlaneGNI("10.98.0.20", l2)},
		{name: "announced where the policy allows by default", gni: controlPlaneGNI("10.98.0.20", nil)},
		{name: "outside the policy's addresses", gni: controlPlaneGNI("10.99.0.20", nil), wantReason: guestnetv1.NotAllowedReason,
			wantIn: []string{"IP 10.99.0.20", "Change spec.controlPlane", "the control plane address of this GuestNodeIdentity"}},
		{name: "on an interface the policy does not allow", gni: controlPlaneGNI("10.98.0.20", &guestnetv1.L2AnnouncementSpec{Interfaces: []string{"^bond0$"}}),
			wantReason: guestnetv1.NotAllowedReason, wantIn: []string{"^bond0$"}},
		{name: "a host Node's address", gni: controlPlaneGNI("10.98.3.7", nil), wantReason: guestnetv1.HostAddressReason,
			wantIn: []string{"a host Node's address", "the control plane address of this GuestNodeIdentity"}},
		{name: "no policy selects the namespace", gni: controlPlaneGNI("10.98.0.20", nil), ns: map[string]string{"tenant": "b"},
			wantReason: guestnetv1.NoPolicyReason, wantIn: []string{"No GuestIngressPolicy selects namespace tenant-a"}},
		{name: "a cap of zero GuestIngresses does not count it", gni: controlPlaneGNI("10.98.0.20", nil),
			policy: func(p *guestnetv1.GuestIngressPolicy) { p.Spec.MaxGuestIngressesPerNamespace = ptr.To[int32](0) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			p := pol("tenants")
			if tt.policy != nil {
				tt.policy(&p)
			}
			ns := tenantA
			if tt.ns != nil {
				ns = namespace("tenant-a", tt.ns)
			}
			d := AdmitControlPlane(Input{Namespace: ns, Policies: []guestnetv1.GuestIngressPolicy{p}, Host: hostSet(),
				GuestIngress: gi(), Siblings: []guestnetv1.GuestIngress{*gi()}}, tt.gni)
			if tt.wantReason == "" {
				g.Expect(d.Admitted).To(BeTrue(), d.Message)
				g.Expect(d.Policy).To(Equal("tenants"))
				g.Expect(d.Announcement.Interfaces).To(Equal([]string{"^eth0$"}))
				g.Expect(d.Announcement.NodeSelector.MatchLabels).To(HaveKeyWithValue("lb", "true"))
				return
			}
			g.Expect(d.Admitted).To(BeFalse())
			g.Expect(d.Reason).To(Equal(tt.wantReason))
			for _, s := range tt.wantIn {
				g.Expect(d.Message).To(ContainSubstring(s))
			}
			g.Expect(d.Message).NotTo(ContainSubstring("GuestIngress."), "worded for the control plane address")
		})
	}
}
