package bridge

import (
	"testing"

	. "github.com/onsi/gomega"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
)

// What a tenant reads about its bridge names only objects of its own namespace: a target
// that a GuestWebhookBridge of another namespace has rewritten (the guest's record names it)
// is TargetClaimed without naming that bridge or its namespace; one of the same namespace is
// named, so the tenant knows which of its bridges to change. What the message leaves out is
// for the manager's log (Withheld).
func TestMessagesNameOnlyTheBridgesNamespace(t *testing.T) {
	for _, tt := range []struct {
		name, claimant string
		want, never    []string
	}{
		{name: "another namespace's bridge", claimant: "zebra-otherns/okapi-bridge",
			want: []string{"another namespace's GuestWebhookBridge"}, never: []string{"zebra-otherns", "okapi-bridge"}},
		{name: "a bridge of this namespace", claimant: other, want: []string{"GuestWebhookBridge other-bridge of this namespace"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewWithT(t)
			gwb := newBridge()
			target := webhookTarget(t, rewrittenBy(t, tt.claimant, "https://x.k0smotron.svc/validate"))
			p := MakePlan(Input{Bridge: gwb, Targets: []Target{target}, GuestServices: defaultGuestServices(), Claimants: map[string]bool{tt.claimant: true}})
			tp := p.Targets[0]
			g.Expect(tp.Reason).To(Equal(guestnetv1.TargetClaimedReason))
			for _, w := range tt.want {
				g.Expect(tp.Message).To(ContainSubstring(w))
			}
			for _, n := range tt.never {
				g.Expect(tp.Message).NotTo(ContainSubstring(n))
				g.Expect(tp.Withheld).To(ContainSubstring(n), "the manager's log names it")
			}
		})
	}
}
