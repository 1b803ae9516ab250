// Package policy decides what a GuestIngress may claim on the host network, from the
// GuestIngressPolicies a host admin wrote (docs/security.md). It is pure: the GuestIngress
// controller observes the inputs, calls Admit, and creates nothing on the host for a
// GuestIngress that is not admitted (guestnet fails closed).
package policy

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	guestnetv1 "github.com/guestnet/cluster-api-addon-provider-guestnet/api/v1alpha1"
	"github.com/guestnet/cluster-api-addon-provider-guestnet/internal/ingress"
)

// Input is everything admission reads.
type Input struct {
	// GuestIngress is the GuestIngress to admit.
	GuestIngress *guestnetv1.GuestIngress
	// Namespace is the GuestIngress's namespace (its labels are matched against the
	// policies' namespaceSelectors); nil when it cannot be read.
	Namespace *corev1.Namespace
	// Policies are all GuestIngressPolicies.
	Policies []guestnetv1.GuestIngressPolicy
	// Siblings are the other GuestIngresses of the namespace (for the per-namespace cap).
	Siblings []guestnetv1.GuestIngress
	// Pools are the CiliumLoadBalancerIPPools by name, for spec.loadBalancer.poolRef.
	Pools map[string]*unstructured.Unstructured
}

// Decision is what admission decided for one GuestIngress.
type Decision struct {
	// Admitted is true when a policy that selects the namespace admits everything the
	// GuestIngress asks for.
	Admitted bool
	// Policy names the admitting policy ("" when none).
	Policy string
	// Reason (an Admitted condition reason) and Message say what is not allowed and which
	// policy would allow it (or which policy admits it).
	Reason  string
	Message string
	// Announcement is what the L2 announcement policy applies: the admitting policy's
	// interfaces and node selector, combined with the GuestIngress's own.
	Announcement ingress.Announcement
}

// Admit decides whether in.GuestIngress is admitted.
//
// Contract placeholder: it admits everything and announces as the GuestIngress asks. The
// real decision (fail closed) replaces it; callers must already treat a Decision with
// Admitted false as "claims nothing, nothing on the host".
func Admit(in Input) Decision {
	gi := in.GuestIngress
	d := Decision{Admitted: true, Reason: guestnetv1.AdmittedReason}
	if l2 := gi.Spec.LoadBalancer.L2; l2 != nil {
		d.Announcement = ingress.Announcement{Interfaces: l2.Interfaces, NodeSelector: l2.NodeSelector}
	}
	return d
}
