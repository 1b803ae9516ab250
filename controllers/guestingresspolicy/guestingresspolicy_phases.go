package guestingresspolicy

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/policy"
)

// maxListed bounds status.guestIngresses (the CRD's limit).
const maxListed = 32

// reconcileStatus counts the namespaces the policy selects and the GuestIngresses it admits
// (policy.Admit over every GuestIngress of those namespaces, with the same inputs the
// GuestIngress controller reads), and says whether the policy can be used as written.
func (r *Reconciler) reconcileStatus(ctx context.Context, s *scope) error {
	p := s.policy
	namespaces := &corev1.NamespaceList{}
	// The cache's own objects, not copies (every policy reads every GuestIngress and
	// namespace on every GuestIngress event): read only.
	if err := r.Client.List(ctx, namespaces, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing namespaces: %w", err)
	}
	host, err := r.HostAddresses.Reserved(ctx)
	if err != nil {
		return err
	}
	world, err := policy.Observe(ctx, r.Client, host)
	if err != nil {
		return err
	}
	all := &guestnetv1.GuestIngressList{}
	if err := r.Client.List(ctx, all, append(r.filterOptions(), client.UnsafeDisableDeepCopy)...); err != nil {
		return fmt.Errorf("listing GuestIngresses: %w", err)
	}

	selected := map[string]bool{}
	for i := range namespaces.Items {
		if policy.Selects(p, &namespaces.Items[i]) {
			selected[namespaces.Items[i].Name] = true
		}
	}
	var admitted []guestnetv1.AdmittedGuestIngress
	for i := range all.Items {
		gi := &all.Items[i]
		if !selected[gi.Namespace] {
			continue
		}
		in, err := world.Input(ctx, gi)
		if err != nil {
			return err
		}
		if d := policy.Admit(in); d.Admitted && d.Policy == p.Name {
			admitted = append(admitted, guestnetv1.AdmittedGuestIngress{Namespace: gi.Namespace, Name: gi.Name, Claim: policy.Claim(gi)})
		}
	}
	setStatus(p, len(selected), admitted)
	setReadyCondition(p, world)
	setHostAddressesOutsideCondition(p, policy.HostAddressesCovered(p, policy.Input{Policies: world.Policies, Pools: world.Pools, Host: world.Host}))
	return nil
}

// setHostAddressesOutsideCondition: HostAddressesOutside says whether the policy's addresses
// and shared pools leave the host's own addresses out; covered names those they hold.
func setHostAddressesOutsideCondition(p *guestnetv1.GuestIngressPolicy, covered string) {
	if covered == "" {
		conditions.Set(p, metav1.Condition{Type: guestnetv1.HostAddressesOutsideCondition, Status: metav1.ConditionTrue,
			Reason: guestnetv1.HostAddressesOutsideReason, Message: "No address the host cluster uses for itself lies in spec.addresses or a shared pool"})
		return
	}
	conditions.Set(p, metav1.Condition{Type: guestnetv1.HostAddressesOutsideCondition, Status: metav1.ConditionFalse,
		Reason: guestnetv1.CoversHostAddressesReason, Message: fmt.Sprintf("spec.addresses or a shared pool holds addresses the host cluster "+
			"uses for itself: %s. guestnet never hands them to a GuestIngress (those asking for them get Admitted=False, HostAddress). "+
			"Narrow spec.addresses to leave them out, or leave it as it is", covered)})
}

// setStatus writes the counts and the first maxListed admitted GuestIngresses, by namespace
// and name, so an unchanged world writes the same status.
func setStatus(p *guestnetv1.GuestIngressPolicy, namespaces int, admitted []guestnetv1.AdmittedGuestIngress) {
	slices.SortFunc(admitted, func(a, b guestnetv1.AdmittedGuestIngress) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	p.Status.Selector = policy.SelectorString(&p.Spec.NamespaceSelector)
	p.Status.Namespaces = int32(namespaces)
	p.Status.AdmittedGuestIngresses = int32(len(admitted))
	p.Status.GuestIngresses = admitted[:min(len(admitted), maxListed)]
}

// setReadyCondition: Ready says whether the policy can be used as written (policy.Usable).
func setReadyCondition(p *guestnetv1.GuestIngressPolicy, world *policy.World) {
	reason, message := policy.Usable(p, world.Pools)
	status := metav1.ConditionTrue
	if reason != guestnetv1.ReadyReason {
		status = metav1.ConditionFalse
	}
	conditions.Set(p, metav1.Condition{Type: guestnetv1.ReadyCondition, Status: status, Reason: reason, Message: message})
}
